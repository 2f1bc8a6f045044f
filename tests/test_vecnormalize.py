"""VecNormalize statistics: a real RL Zoo folder that SB3 writes here, checked against SB3's own
`predict` on normalized observations, and pickles that must be refused without running.

Each folder trains PPO behind VecNormalize for a few hundred steps (so the statistics are real),
then redraws the weights from N(0, 1) as the other SB3 tests do, so that logits are large and
every rounding in the normalizer shows.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from harness.errors import PolicyLoadError
from harness.policies import cast_policy, load_policy
from harness.policies import vecnormalize
from harness.policies.vecnormalize import ALLOWED, Moments, read_vecnormalize
from tests.builders import SB3Expert, ZooRun, write_zoo_run

# Spreads of the test observations: typical, wide, and far outside training so clip_obs acts.
SCALES = (0.1, 1.0, 10.0, 1000.0)


@pytest.fixture(scope="module", params=["CartPole-v1", "Pendulum-v1"])
def zoo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ZooRun:
    return write_zoo_run(tmp_path_factory.mktemp("zoo"), request.param)


def observations(size: int, n: int = 500) -> np.ndarray:
    rng = np.random.default_rng(1)
    return np.concatenate([rng.normal(size=(n, size)) * scale for scale in SCALES]).astype(np.float32)


def sb3_logits(model: PPO, normalized: np.ndarray) -> torch.Tensor:
    policy = model.policy
    with torch.no_grad():
        features = policy.extract_features(torch.as_tensor(normalized), policy.pi_features_extractor)
        return policy.action_net(policy.mlp_extractor.forward_actor(features))


def test_rl_zoo_folder_matches_sb3_predict(zoo: ZooRun) -> None:
    policy = load_policy(str(zoo.zip))
    obs = observations(policy.info.obs_size)
    normalized = zoo.venv.normalize_obs(obs)  # SB3: float64 numpy, handed to the policy as float32
    with torch.no_grad():
        ours_normalized = policy.normalizer(torch.from_numpy(obs)).numpy()
        ours = policy(torch.from_numpy(obs))

    assert np.any(np.abs(normalized) == zoo.venv.clip_obs), "no observation reached clip_obs"
    # float32 statistics against SB3's float64 arithmetic: at most about an ulp of clip_obs.
    assert np.max(np.abs(ours_normalized - normalized)) <= 2e-6
    assert torch.max(torch.abs(ours - sb3_logits(zoo.model, normalized))).item() <= 1e-4
    predicted, _ = zoo.model.predict(normalized, deterministic=True)
    if policy.info.action_kind == "discrete":
        assert np.array_equal(policy.deterministic_action(ours).numpy(), predicted)
    else:  # SB3 clips a Box action to the space's bounds
        space = zoo.model.action_space
        assert np.max(np.abs(np.clip(ours.numpy(), space.low, space.high) - predicted)) <= 1e-4


def test_info_records_environment_and_normalization(zoo: ZooRun) -> None:
    info = load_policy(str(zoo.zip)).info
    env_id = zoo.zip.stem
    assert (info.env_id, info.env_source) == (env_id, f"RL Zoo {env_id}/args.yml")
    assert info.obs_normalization == f"VecNormalize from {env_id}/vecnormalize.pkl: clip 10, epsilon 1e-08"
    assert info.detail.endswith("pi [64, 64], VecNormalize clip 10, epsilon 1e-08")
    # The identity covers both files: `cat zip pkl | sha256sum`.
    assert info.sha256 == hashlib.sha256(zoo.zip.read_bytes() + zoo.stats.read_bytes()).hexdigest()


def test_other_statistics_are_another_policy(zoo: ZooRun, tmp_path: Path) -> None:
    env_id = zoo.zip.stem
    (tmp_path / env_id).mkdir()
    (tmp_path / f"{env_id}.zip").write_bytes(zoo.zip.read_bytes())
    shifted = VecNormalize.load(str(zoo.stats), DummyVecEnv([lambda: gym.make(env_id)]))
    shifted.obs_rms.mean = shifted.obs_rms.mean + 1.0
    shifted.save(tmp_path / env_id / "vecnormalize.pkl")
    assert load_policy(str(tmp_path / f"{env_id}.zip")).info.sha256 != load_policy(str(zoo.zip)).info.sha256


def test_golden_and_card_dtypes_keep_the_normalizer_form(zoo: ZooRun) -> None:
    policy = load_policy(str(zoo.zip))
    obs = observations(policy.info.obs_size)
    golden = cast_policy(policy, "float64").normalizer
    half = cast_policy(policy, "float16").normalizer
    assert golden.running_var.dtype == torch.float64 and half.running_var.dtype == torch.float32
    with torch.no_grad():
        ours = golden(torch.from_numpy(obs).double()).numpy()
    # float32-rounded statistics in float64 arithmetic against SB3's float64 statistics.
    exact = zoo.venv._normalize_obs(obs, zoo.venv.obs_rms)
    assert np.max(np.abs(ours - exact)) <= 1e-6


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_every_protocol_sb3_writes_reads_back(zoo: ZooRun, protocol: int, tmp_path: Path) -> None:
    """Python 3.8-3.13 pickle with protocol 4, 3.14 with 5, older with 3; numpy differs per protocol."""
    path = tmp_path / "vecnormalize.pkl"
    zoo.venv.observation_space.seed(0)  # spaces then carry a numpy Generator, as RL Zoo ones do
    path.write_bytes(pickle.dumps(zoo.venv, protocol=protocol))
    stats = read_vecnormalize(path)
    assert isinstance(stats.obs_rms, Moments)
    assert np.array_equal(stats.obs_rms.mean, zoo.venv.obs_rms.mean)
    assert np.array_equal(stats.obs_rms.var, zoo.venv.obs_rms.var)
    assert (stats.norm_obs, stats.epsilon, stats.clip_obs) == (True, 1e-8, 10.0)


def test_globals_of_a_real_file_are_all_on_the_list(zoo: ZooRun) -> None:
    named: list[tuple[str, str]] = []

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            named.append((module, name))
            return super().find_class(module, name)

    with zoo.stats.open("rb") as f:
        Recording(f).load()
    assert set(named) <= set(ALLOWED), sorted(set(named) - set(ALLOWED))
    assert ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize") in named


def test_norm_obs_false_is_recorded_and_not_applied(tmp_path: Path) -> None:
    run = write_zoo_run(tmp_path, "CartPole-v1", norm_obs=False)
    policy = load_policy(str(run.zip))
    assert policy.normalizer is None
    assert policy.info.obs_normalization.startswith("none: VecNormalize in CartPole-v1/vecnormalize.pkl has norm_obs")
    assert policy.info.detail.endswith(", VecNormalize without norm_obs (not applied)")
    assert policy.info.sha256 == hashlib.sha256(run.zip.read_bytes()).hexdigest()
    obs = observations(4)
    with torch.no_grad():
        assert torch.max(torch.abs(policy(torch.from_numpy(obs)) - sb3_logits(run.model, obs))).item() <= 1e-4


def test_statistics_of_another_observation_size_are_refused(sb3_expert: SB3Expert, tmp_path: Path) -> None:
    policy = tmp_path / "CartPole-v1.zip"
    policy.write_bytes(sb3_expert.zip.read_bytes())
    (tmp_path / "CartPole-v1").mkdir()
    VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")])).save(tmp_path / "CartPole-v1" / "vecnormalize.pkl")
    problem = r"vecnormalize.pkl: normalizes 3 observation values, but CartPole-v1.zip takes 4$"
    with pytest.raises(PolicyLoadError, match=problem):
        load_policy(str(policy))


class _CreatesFile:
    """Unpickling it calls open(path, "w"), which creates the file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


class _RunsShell:
    """Unpickling it runs `touch path` in a shell."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


class _LoadsNumpy:
    """A global from numpy, a module the list admits other names of."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (np.load, ("elsewhere.npy",))


def assert_refused(path: Path, global_name: str) -> None:
    with pytest.raises(PolicyLoadError) as caught:
        read_vecnormalize(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: pickles {global_name!r}, "), message


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_planted_payloads_never_run(zoo: ZooRun, protocol: int, tmp_path: Path) -> None:
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_RunsShell(control), protocol=protocol))
    assert control.exists(), "the payload must be live, or this test proves nothing"

    marker = tmp_path / "pwned"
    shell = f"{os.system.__module__}.system"  # posix.system
    bare = tmp_path / "bare.pkl"
    for payload, name in ((_CreatesFile(marker), "io.open"), (_RunsShell(marker), shell)):
        bare.write_bytes(pickle.dumps(payload, protocol=protocol))
        assert_refused(bare, name)
    # Inside an otherwise real file, after the VecNormalize global has been admitted. Protocol 2
    # pickles bytes with _codecs.encode, which no SB3 save (protocol 3 and up) holds: refused there.
    planted = tmp_path / "planted.pkl"
    metadata = zoo.venv.metadata
    zoo.venv.metadata = {**metadata, "render_modes": _RunsShell(marker)}
    try:
        planted.write_bytes(pickle.dumps(zoo.venv, protocol=protocol))
    finally:
        zoo.venv.metadata = metadata
    assert_refused(planted, shell if protocol >= 3 else "_codecs.encode")
    assert not marker.exists()


def test_names_beside_allowed_ones_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(pickle.dumps(_LoadsNumpy(), protocol=4))
    assert_refused(path, "numpy.load")
    path.write_bytes(pickle.dumps(VecNormalize.load, protocol=4))  # a qualified name in an allowed module
    assert_refused(path, "stable_baselines3.common.vec_env.vec_normalize.VecNormalize.load")


class _ForgedDtype:
    """A structured dtype with an object field whose pickled state drops its object flags."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0))


class _ForgedArray:
    """Built by numpy's own _reconstruct and ndarray.__setstate__: eight raw bytes become an
    object pointer, 0x4141414141414141, which reading the element dereferences."""

    def __reduce__(self) -> tuple[Any, ...]:
        reconstruct = np.zeros(0).__reduce__()[0]
        return (reconstruct, (np.ndarray, (0,), b"b"), (1, (1,), _ForgedDtype(), False, b"A" * 8))


# Reads the forged element in a child without core dumps, since it crashes.
READ_ELEMENT = (
    "import pickle, resource, sys; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
    "print(pickle.loads(sys.stdin.buffer.read())['a'][0])"
)


def _with_mean(zoo: ZooRun, mean: Any, path: Path) -> Path:
    """The fixture's statistics pickled with `mean` in place of obs_rms.mean."""
    real = zoo.venv.obs_rms.mean
    zoo.venv.obs_rms.mean = mean
    try:
        path.write_bytes(pickle.dumps(zoo.venv))
    finally:
        zoo.venv.obs_rms.mean = real
    return path


def test_numpy_values_are_rebuilt_only_from_plain_numeric_dtypes(zoo: ZooRun, tmp_path: Path) -> None:
    """numpy's reconstructors trust the dtype state they get, so only records are kept and only
    plain numeric dtypes rebuilt: a forged dtype that crashes numpy's own unpickling is refused."""
    read = [sys.executable, "-c", READ_ELEMENT]
    control = subprocess.run(read, input=pickle.dumps(_ForgedArray()), capture_output=True, cwd=tmp_path)
    assert control.returncode < 0, "numpy must crash on the forged pointer, or this test proves nothing"

    refused = r"obs_rms mean is not a plain numeric numpy value \(dtype {}\)$"
    forged = _with_mean(zoo, _ForgedArray(), tmp_path / "forged.pkl")
    with pytest.raises(PolicyLoadError, match="forged.pkl: " + refused.format(r"\|V8")):
        read_vecnormalize(forged)
    objects = _with_mean(zoo, zoo.venv.obs_rms.mean.astype(object), tmp_path / "objects.pkl")
    with pytest.raises(PolicyLoadError, match=refused.format("object")):
        read_vecnormalize(objects)
    # Any byte order and float width of a plain array is rebuilt, as float64.
    big_endian = _with_mean(zoo, zoo.venv.obs_rms.mean.astype(">f4"), tmp_path / "big.pkl")
    stats = read_vecnormalize(big_endian)
    assert isinstance(stats.obs_rms, Moments) and stats.obs_rms.mean.dtype == np.float64
    assert np.array_equal(stats.obs_rms.mean, zoo.venv.obs_rms.mean.astype(np.float32))


def test_unreadable_files_raise_one_line_errors(zoo: ZooRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = zoo.stats.read_bytes()
    files = {
        "truncated": (whole[: len(whole) // 2], "is not a readable VecNormalize pickle"),
        "not-pickle": (b"mean: [0, 1]\n", "is not a readable VecNormalize pickle"),
        "a-dict": (pickle.dumps({"obs_rms": None}), "holds a dict, not a pickled VecNormalize"),
    }
    for case, (content, problem) in files.items():
        path = tmp_path / f"{case}.pkl"
        path.write_bytes(content)
        with pytest.raises(PolicyLoadError) as caught:
            read_vecnormalize(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: ") and "\n" not in message, case
        assert problem in message, f"{case}: {message}"
    monkeypatch.setattr(vecnormalize, "MAX_STATS_BYTES", len(whole) - 1)
    with pytest.raises(PolicyLoadError, match=re.escape(f"is over the {len(whole) - 1} byte limit")):
        read_vecnormalize(zoo.stats)
