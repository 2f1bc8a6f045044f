"""Stable-Baselines3 zip (any 1.x or 2.x save) -> `PolicyNet`, without unpickling anything.

The save names its policy class; one table (`FAMILIES`) says which family rebuilds it, and with
which features extractor by default: actor-critic (PPO, A2C, TRPO, with or without gSDE),
Q-networks (DQN, QR-DQN), deterministic actors (TD3, DDPG), squashed Gaussian actors (SAC,
TQC, CrossQ), ARS; each as an MLP, CNN or dict-observation policy. A class the table does not
hold is refused by name, with what is supported; so is a `policy_kwargs` key that could change
the network and is not read (`sb3.options`). How the zip and its `data` are read is
`sb3.archive`; each family is a module of `harness.policies.sb3`.

The files beside the zip (`policy_files`) say what the zip does not: the environment (the RL
Zoo's args.yml, a Hugging Face model card) and the VecNormalize statistics the policy was
trained behind, which become its `normalizer` (`vecnormalize`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harness.errors import PolicyLoadError
from harness.files import sha256_of
from harness.policies.base import Memory, ObsInput, PolicyInfo, PolicyNet
from harness.policies.loader import Peek, PolicyFormat, PolicySpec
from harness.policies.policy_files import PLAIN, find_env, find_vecnormalize
from harness.policies.sb3 import actor_critic, ars, q_networks, sac, td3
from harness.policies.sb3.archive import (
    PolicyClass,
    extractor_class,
    load_state_dict,
    parse_data,
    policy_class,
    policy_kwargs,
    read_archive,
)
from harness.policies.sb3.layers import COMBINED, FLATTEN, NATURE, Weights
from harness.policies.sb3.options import check_policy_kwargs
from harness.policies.sb3.save import Actor, Save
from harness.policies.sb3.spaces import ActionSpace, DictSpace, action_space, observation_space
from harness.policies.vecnormalize import Moments, VecNormalizeObs, VecNormalizeStats, read_vecnormalize


@dataclass(frozen=True)
class Family:
    """Who rebuilds a policy class, over which features extractor unless policy_kwargs name one."""

    build: Callable[[Save], Actor]
    extractor: str
    algorithms: str


def _variants(
    module: str, names: tuple[str, str, str], build: Callable[[Save], Actor], algorithms: str
) -> dict[PolicyClass, Family]:
    """An algorithm's MlpPolicy, CnnPolicy and MultiInputPolicy classes."""
    return {
        PolicyClass(module, name): Family(build, extractor, algorithms)
        for name, extractor in zip(names, (FLATTEN, NATURE, COMBINED), strict=True)
    }


SB3_COMMON = "stable_baselines3.common.policies"
OFF_POLICY = ("CnnPolicy", "MultiInputPolicy")
FAMILIES: dict[PolicyClass, Family] = {
    **_variants(
        SB3_COMMON,
        ("ActorCriticPolicy", "ActorCriticCnnPolicy", "MultiInputActorCriticPolicy"),
        actor_critic.build,
        "PPO, A2C, TRPO",
    ),
    **_variants("stable_baselines3.dqn.policies", ("DQNPolicy", *OFF_POLICY), q_networks.dqn, "DQN"),
    **_variants("sb3_contrib.qrdqn.policies", ("QRDQNPolicy", *OFF_POLICY), q_networks.qrdqn, "QR-DQN"),
    **_variants("stable_baselines3.td3.policies", ("TD3Policy", *OFF_POLICY), td3.build, "TD3, DDPG"),
    **_variants("stable_baselines3.sac.policies", ("SACPolicy", *OFF_POLICY), sac.build, "SAC"),
    **_variants("sb3_contrib.tqc.policies", ("TQCPolicy", *OFF_POLICY), sac.build, "TQC"),
    # sb3-contrib's CrossQ has an MlpPolicy only; another extractor comes by policy_kwargs.
    PolicyClass("sb3_contrib.crossq.policies", "CrossQPolicy"): Family(sac.crossq, FLATTEN, "CrossQ"),
    PolicyClass("sb3_contrib.ars.policies", "ARSPolicy"): Family(ars.build, FLATTEN, "ARS"),
    PolicyClass("sb3_contrib.ars.policies", "ARSLinearPolicy"): Family(ars.build, FLATTEN, "ARS"),
    **_variants(
        "sb3_contrib.common.recurrent.policies",
        ("RecurrentActorCriticPolicy", "RecurrentActorCriticCnnPolicy", "RecurrentMultiInputActorCriticPolicy"),
        actor_critic.recurrent,
        "RecurrentPPO",
    ),
    **_variants(
        "sb3_contrib.common.maskable.policies",
        ("MaskableActorCriticPolicy", "MaskableActorCriticCnnPolicy", "MaskableMultiInputActorCriticPolicy"),
        actor_critic.maskable,
        "MaskablePPO",
    ),
}
SUPPORTED = ", ".join(dict.fromkeys(f.algorithms for f in FAMILIES.values())) + " (Mlp, Cnn and MultiInput policies)"


class Sb3Zip(PolicyFormat):
    name = "sb3-zip"
    suffixes = (".zip",)
    what = "a zip with data and policy.pth (a Stable-Baselines3 save)"

    @classmethod
    def claims(cls, peek: Peek) -> bool:
        return peek.zip_members is not None and {"data", "policy.pth"} <= peek.zip_members

    @classmethod
    def load(cls, path: Path, spec: PolicySpec) -> PolicyNet:
        return load_sb3_zip(path, env_files=not spec.env_overrides)


def load_sb3_zip(path: Path, name: str | None = None, env_files: bool = True) -> PolicyNet:
    """Rebuild the acting path of an SB3 save as a float32 `PolicyNet`; PolicyLoadError if unusable.
    `env_files=False`: the caller knows the environment, and the files beside the zip are not
    read for one (the VecNormalize statistics still are: they are part of the policy)."""
    path = Path(path)
    archive = read_archive(path)
    data = parse_data(path, archive.data)
    kwargs = policy_kwargs(path, data)
    cls = policy_class(path, data)
    unread = check_policy_kwargs(path, kwargs)
    family = _family(path, cls)
    save = Save(
        path,
        data,
        kwargs,
        cls,
        extractor_class(path, kwargs) or family.extractor,
        Weights(path, load_state_dict(path, archive.policy_pth)),
        observation_space(path, data),
        action_space(path, data),
    )
    actor = family.build(save)
    env = find_env(path) if env_files else None
    stats_path = find_vecnormalize(path)
    stats = read_vecnormalize(stats_path) if stats_path is not None else None
    inputs = actor.features.inputs
    normalizer = _normalizer(path, stats, save, inputs)
    # Other statistics make another policy, so the identity covers the statistics applied: the
    # zip's bytes, then theirs (`cat` the two files into sha256sum to check it).
    applied = stats.content if stats is not None and normalizer is not None else b""
    info = PolicyInfo(
        name=name if name is not None else str(path),
        source="sb3-zip",
        action_kind=save.action.kind,
        inputs=inputs,
        action_size=save.action.size,
        sha256=sha256_of(archive.content, applied),
        env_id=env.env_id if env is not None else None,
        env_source=env.source if env is not None else "",
        detail=f"SB3 {archive.version}, {actor.detail}{_stats_detail(stats)}{_unread_detail(unread)}",
        obs_normalization=_obs_normalization(path, stats),
        env_setup=env.setup if env is not None else PLAIN,
        published=env.published if env is not None else None,
        sampling=actor.sampling,
        memory=Memory(actor.memory.num_layers, actor.memory.hidden_size) if actor.memory is not None else None,
        masked=actor.masked,
        branches=save.action.branches,
    )
    return PolicyNet(
        info,
        actor.body,
        actor.head,
        normalizer=normalizer,
        log_sigma=actor.log_sigma,
        features=actor.features.module,
        log_std=actor.log_std,
        normalize_images=actor.features.normalize_images,
        action_bounds=_bounds(path, save.action) if actor.squashed else None,
        memory=actor.memory,
    )


def _family(path: Path, cls: PolicyClass) -> Family:
    family = FAMILIES.get(cls)
    if family is not None:
        return family
    problem = f"policy class {cls.describe()} is not supported (not a policy class this loader knows)"
    raise PolicyLoadError(path, f"{problem}; supported: {SUPPORTED}")


def _bounds(path: Path, action: ActionSpace) -> tuple[torch.Tensor, torch.Tensor]:
    """The Box's bounds a squashed policy rescales its tanh into, as SB3's unscale_action does."""
    if action.low is None or action.high is None or not all(map(math.isfinite, (*action.low, *action.high))):
        problem = "squashed actions are rescaled to the action space's bounds, and data gives no finite bounds"
        raise PolicyLoadError(path, problem)
    return torch.tensor(action.low, dtype=torch.float32), torch.tensor(action.high, dtype=torch.float32)


def _normalizer(
    path: Path, stats: VecNormalizeStats | None, save: Save, inputs: tuple[ObsInput, ...]
) -> VecNormalizeObs | None:
    """SB3's normalization where the statistics say norm_obs, after checking they fit the policy:
    over its float inputs, flattened and concatenated in order, as PolicyNet hands them over."""
    if stats is None or stats.obs_rms is None:
        return None
    per_key = isinstance(stats.obs_rms, dict)
    if per_key != isinstance(save.observation, DictSpace):
        stated, taken = ("a Dict's keys", "a Box") if per_key else ("a Box", "a Dict")
        raise PolicyLoadError(stats.path, f"normalizes {stated}, but {path.name} takes {taken} observation")
    moments = stats.obs_rms if isinstance(stats.obs_rms, dict) else {inputs[0].name: stats.obs_rms}
    names = {i.name: i for i in inputs}
    for key in moments:
        if key not in names:
            raise PolicyLoadError(stats.path, f"normalizes key {key!r}, which {path.name} does not take")
        if names[key].dtype == "uint8":
            raise PolicyLoadError(stats.path, f"normalizes the image {key!r}: not supported")
    return _vecnormalize(path, stats, moments, [i for i in inputs if i.dtype == "float32"])


def _vecnormalize(
    path: Path, stats: VecNormalizeStats, moments: dict[str, Moments], floats: list[ObsInput]
) -> VecNormalizeObs:
    """One normalizer over the float inputs' concatenation; a key outside norm_obs_keys passes."""
    means, variances, passing = [], [], []
    for inp in floats:
        got = moments.get(inp.name)
        if got is not None and got.mean.size != inp.size:
            problem = f"normalizes {got.mean.size} observation values, but {path.name} takes {inp.size}"
            raise PolicyLoadError(stats.path, problem if inp.name == "obs" else f"{problem} for key {inp.name!r}")
        means.append(got.mean.reshape(-1) if got is not None else np.zeros(inp.size))
        variances.append(got.var.reshape(-1) if got is not None else np.ones(inp.size))
        passing.append(np.full(inp.size, got is None))
    passthrough = np.concatenate(passing)
    mean, var = np.concatenate(means), np.concatenate(variances)
    return VecNormalizeObs(mean, var, stats.epsilon, stats.clip_obs, passthrough if passthrough.any() else None)


def _obs_normalization(path: Path, stats: VecNormalizeStats | None) -> str:
    if stats is None:
        return ""
    where = stats.path.relative_to(path.parent)
    if not stats.norm_obs:
        return f"none: VecNormalize in {where} has norm_obs False, so observations go in as they are"
    return f"VecNormalize from {where}: {stats.describe()}"


def _stats_detail(stats: VecNormalizeStats | None) -> str:
    if stats is None:
        return ""
    return f", VecNormalize {stats.describe()}" if stats.norm_obs else ", VecNormalize without norm_obs (not applied)"


def _unread_detail(unread: tuple[str, ...]) -> str:
    return f", policy_kwargs not in the forward: {', '.join(unread)}" if unread else ""
