"""An environment as the harness makes it for one episode, as the RL Zoo makes it.

`gym.make(env_id, **kwargs)`, wrapped in an `EpisodeRecorder` where SB3's `make_vec_env` puts its
Monitor (right around the environment), then in each `env_wrapper` of the policy's run files in
order. A wrapper that makes the environment an older version of itself (an `EnvironmentVersion`,
harness/envs/versions.py, which a rename adds) is part of the environment: it goes under the
recorder, so that the rewards recorded are the old version's. The frames SB3's VecFrameStack
stacks, and the images VecTransposeImage turns channels first, act on the batch:
harness/envs/observations.py.

A run file names its wrappers by class path, and importing a module runs it: only the modules in
`WRAPPER_MODULES` are imported, and only a gymnasium Wrapper class from them is used. Atari ids are
registered by ale-py (`gymnasium.register_envs(ale_py)`, with the `atari` extra), looked for once
an id is not registered already.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium as gym
import seals  # noqa: F401  (registers seals/* environments)

from harness.envs.versions import EnvironmentVersion
from harness.errors import UsageError, first_line
from harness.policies.base import PolicyInfo
from harness.policies.policy_files import PLAIN, EnvSetup, Wrapper

# The modules an `env_wrapper` may come from, and how to install each.
WRAPPER_MODULES = {
    "stable_baselines3.common.atari_wrappers": "pip install -e '.[atari]'",
    "sb3_contrib.common.wrappers": "pip install sb3-contrib",
    "gymnasium.wrappers": "gymnasium",
    "rl_zoo3.wrappers": "pip install rl_zoo3",
    "harness.envs.versions": "this harness",
}
ATARI_EXTRA = "pip install -e '.[atari]'"
MUJOCO_EXTRA = "pip install -e '.[mujoco]'"
# sb3-contrib's environment of MaskablePPO's examples (harness/envs/invalid_actions.py), registered
# here and made from that module, which only making it imports (it needs sb3-contrib).
INVALID_ACTIONS_ID = "sb3_contrib/InvalidActionEnvDiscrete-v0"
if INVALID_ACTIONS_ID not in gym.registry:
    gym.register(
        INVALID_ACTIONS_ID,
        entry_point="harness.envs.invalid_actions:SeededInvalidActionEnvDiscrete",
        kwargs={"dim": 80, "n_invalid_actions": 60},  # MaskablePPO's documented example
    )
# gymnasium 1.x registers MuJoCo's mujoco-py ids (-v2, -v3) to this function, which only raises
# "moved to the gymnasium-robotics project": registered, but not made.
REFUSING_ENTRY_POINT = ("gymnasium.envs", "_raise_mujoco_py_error")


@dataclass(frozen=True)
class EnvSpec:
    """A registered gymnasium id and how the policy's files say to make it."""

    env_id: str
    setup: EnvSetup = PLAIN

    @classmethod
    def of(cls, env: EnvSpec | str) -> EnvSpec:
        """`env` itself, or a bare id made with nothing else."""
        return env if isinstance(env, EnvSpec) else cls(env)

    @classmethod
    def played_by(cls, info: PolicyInfo) -> EnvSpec | None:
        """The environment a policy plays, as its files (or the options) say to make it; None where it has none."""
        return cls(info.env_id, info.env_setup) if info.env_id is not None else None

    @property
    def key(self) -> str:
        """What names the environment in unit ids and messages: the id, and its setup where it has one."""
        return self.env_id if self.setup.plain else f"{self.env_id} [{self.setup.describe()}]"


class EpisodeRecorder(gym.Wrapper[Any, Any, Any, Any]):
    """The environment's own episode, where SB3's Monitor records it: its rewards as it gives them
    (before any wrapper clips them), and whether it is over, whatever the wrappers above say (an
    EpisodicLifeEnv ends an episode at each lost life; the game goes on)."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.over = True  # until the first reset
        self.resets = 0
        self._reward = 0.0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.over = False
        self.resets += 1
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._reward += float(reward)
        self.over = bool(terminated or truncated)
        return obs, reward, terminated, truncated, info

    def take_reward(self) -> float:
        """The reward since the last call, summed in the order the environment gave it."""
        reward, self._reward = self._reward, 0.0
        return reward


def make_env(spec: EnvSpec) -> tuple[gym.Env[Any, Any], EpisodeRecorder]:
    """One environment of `spec`, wrapped, and its recorder; UsageError (one line) where it cannot be made."""
    require_registered(spec.env_id)
    classes = [wrapper_class(w) for w in spec.setup.wrappers]  # refused before anything is made
    if str(gym.spec(spec.env_id).entry_point).startswith("gymnasium.envs.mujoco"):
        _mujoco_warnings_to_python()
    try:
        with warnings.catch_warnings():
            # gymnasium notes, for every CartPole made, that its float64 bounds became float32.
            warnings.simplefilter("ignore", UserWarning)
            kwargs: dict[str, Any] = dict(spec.setup.kwargs)
            base = gym.make(spec.env_id, **kwargs)
    except (gym.error.DependencyNotInstalled, ModuleNotFoundError) as exc:
        raise UsageError(
            f"environment {spec.env_id} cannot be made: {first_line(exc)} (this harness installs Box2D with "
            f"the box2d wheel by default, Atari with {ATARI_EXTRA} and MuJoCo with {MUJOCO_EXTRA})"
        ) from exc
    except Exception as exc:  # an unknown keyword argument, a missing ROM, ...: all mean "cannot be made"
        raise UsageError(f"environment {spec.key} cannot be made: {first_line(exc)}") from exc
    wrappers = list(zip(classes, spec.setup.wrappers, strict=True))
    versions = [(cls, w) for cls, w in wrappers if issubclass(cls, EnvironmentVersion)]
    recorder = EpisodeRecorder(_wrapped(base, versions, spec.env_id))
    env = _wrapped(recorder, [(cls, w) for cls, w in wrappers if not issubclass(cls, EnvironmentVersion)], spec.env_id)
    return env, recorder


def _wrapped(
    env: gym.Env[Any, Any], wrappers: Sequence[tuple[type[gym.Wrapper[Any, Any, Any, Any]], Wrapper]], env_id: str
) -> gym.Env[Any, Any]:
    """`env` in each of `wrappers`, in order."""
    for cls, wrapper in wrappers:
        try:
            env = cls(env, **dict(wrapper.kwargs))
        except Exception as exc:  # a wrapper's own checks (AtariWrapper asserts on its input) raise anything
            raise UsageError(f"env_wrapper {wrapper.describe()} cannot wrap {env_id}: {first_line(exc)}") from exc
    return env


def wrapper_class(wrapper: Wrapper) -> type[gym.Wrapper[Any, Any, Any, Any]]:
    """The gymnasium Wrapper class `wrapper.path` names, from one of WRAPPER_MODULES only."""
    module_name, _, name = wrapper.path.rpartition(".")
    if module_name not in WRAPPER_MODULES:
        raise UsageError(
            f"env_wrapper {wrapper.path}: wrappers are taken only from {', '.join(WRAPPER_MODULES)} "
            "(importing any other module named in a run file would run code it chose)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"env_wrapper {wrapper.path} needs {module_name} ({WRAPPER_MODULES[module_name]}): {exc}") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, gym.Wrapper)):
        raise UsageError(f"env_wrapper {wrapper.path}: {module_name} has no gymnasium Wrapper {name}")
    return cls


def is_registered(env_id: str) -> bool:
    """Whether the installed gymnasium (with the extras' environments) registers `env_id` to be
    made: not MuJoCo's mujoco-py ids, which it registers only to refuse them."""
    if env_id not in gym.registry and not (_register_extras() and env_id in gym.registry):
        return False
    entry = gym.registry[env_id].entry_point
    return (getattr(entry, "__module__", None), getattr(entry, "__name__", None)) != REFUSING_ENTRY_POINT


def require_registered(env_id: str) -> None:
    """UsageError for an id gymnasium does not know (after the extras have registered theirs),
    with gymnasium's own hint for an old version, else the closest ids."""
    if is_registered(env_id):
        return
    if env_id in gym.registry:
        raise UsageError(
            f"environment {env_id!r} is registered in gymnasium {gym.__version__} only to be refused: the mujoco-py "
            "ids moved to gymnasium-robotics, and this one has no mapping to one gymnasium makes "
            "(docs/own-policy.md: the renames table)"
        )
    try:
        gym.spec(env_id)
    except gym.error.DeprecatedEnv as exc:
        raise UsageError(
            f"environment {env_id!r} is not registered in gymnasium {gym.__version__}: {first_line(exc)} "
            "That version computes something else, so it is not put in its place (docs/own-policy.md: the renames table); "
            "the config's [envs] plays it on purpose"
        ) from None
    except gym.error.Error:
        pass
    ids = sorted(gym.registry)
    close = difflib.get_close_matches(env_id, ids, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; e.g. CartPole-v1, Pendulum-v1, seals/CartPole-v0"
    atari = "" if _ale_installed() else f" (Atari ids come with {ATARI_EXTRA})"
    raise UsageError(f"environment {env_id!r} is not registered in gymnasium{hint}{atari}")


@functools.cache
def _mujoco_warnings_to_python() -> None:
    """MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working folder, and mujoco 4 warns on
    every HalfCheetah made (gymnasium's model uses an attribute it deprecates): they go to
    Python's warnings instead, each shown once."""
    import mujoco

    mujoco.set_mju_user_warning(lambda message: warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=1))


@functools.cache
def _register_extras() -> bool:
    """Register the environments of the optional packages that are installed; True when any did."""
    if not _ale_installed():
        return False
    import ale_py

    gym.register_envs(ale_py)
    return True


def _ale_installed() -> bool:
    return importlib.util.find_spec("ale_py") is not None
