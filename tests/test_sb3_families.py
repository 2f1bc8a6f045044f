"""Every feed-forward policy family of SB3 and sb3-contrib, and every constructor option they
take that changes the network, loaded from a save and checked against SB3's own networks on the
same observations: the head, the deterministic action (`predict`), and the stochastic action
given the same noise (SB3's distribution with the harness's draw; gSDE with SB3's exploration
matrices set to the harness's). Box, image and dict observations, with and without VecNormalize;
each family's ONNX export against the harness's float32 policy through onnxruntime; and each
refusal, by name.

Models are built untrained by the installed SB3 and sb3-contrib, small, with their weights
redrawn from N(0, 1) (batch norm statistics too) so that every layer matters, as
tests/test_sb3_zip.py does.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import io
import json
import shutil
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from sb3_contrib import ARS, QRDQN, TQC, TRPO, CrossQ
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy, BaseModel
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from harness.dtypes import GOLDEN_DTYPE
from harness.errors import PolicyLoadError
from harness.inference.capture import capture_activations, layer_modules
from harness.inference.forward import forward_outputs, head_name
from harness.judge.localize import first_divergent_layer
from harness.policies import PolicyNet, cast_policy, load_policy
from harness.policies.base import SamplingKind
from harness.policies.export_onnx import export_onnx
from harness.policies import sb3_zip
from harness.policies.sb3.archive import ACTIVATIONS
from harness.policies.sb3.options import NOT_IN_THE_FORWARD, READ
from harness.policies.sb3_zip import load_sb3_zip
from harness.workloads import EXPLORE, make_batch
from tests.builders import rewrite_zip

ROWS = 64
# Float32 on the same CPU: the same operations as SB3's, so equal but for rounding.
ATOL = 1e-5


class VectorEnv(gym.Env[np.ndarray, Any]):
    """A Box observation and a Box action of two dimensions with bounds that are not symmetric,
    so that unscale_action and a per-action std show; or a Discrete action."""

    def __init__(self, discrete: bool = False) -> None:
        self.observation_space = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(3) if discrete else gym.spaces.Box(-1.0, 2.0, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:  # the observations it samples, and so VecNormalize's statistics, are the seed's
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return self.observation_space.sample(), 0.0, False, False, {}


class ImageEnv(VectorEnv):
    """uint8 images channels last, as Atari frames come: SB3 wraps it in VecTransposeImage."""

    def __init__(self, discrete: bool = True) -> None:
        super().__init__(discrete)
        self.observation_space = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)  # type: ignore[assignment]


class DictEnv(VectorEnv):
    """A dict observation of a vector, an image and a matrix (its key order is sorted: a, img, vec)."""

    def __init__(self, discrete: bool = False) -> None:
        super().__init__(discrete)
        self.observation_space = gym.spaces.Dict(  # type: ignore[assignment]
            {
                "vec": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                "img": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
                "a": gym.spaces.Box(-2.0, 2.0, (2, 2), np.float32),
            }
        )


class VectorDictEnv(VectorEnv):
    """A goal-style dict observation, vectors only."""

    def __init__(self, discrete: bool = False) -> None:
        super().__init__(discrete)
        self.observation_space = gym.spaces.Dict(  # type: ignore[assignment]
            {"observation": gym.spaces.Box(-3.0, 3.0, (4,), np.float32), "goal": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
        )


def small(**more: Any) -> dict[str, Any]:
    """policy_kwargs of their own for each model: SB3 writes into the dict it is given (DDPG's n_critics)."""
    return {"net_arch": [16, 8], **more}


def cnn(**more: Any) -> dict[str, Any]:
    return {"features_extractor_kwargs": {"features_dim": 16}, **more}


def multi() -> dict[str, Any]:
    return {"features_extractor_kwargs": {"cnn_output_dim": 8}, "net_arch": [16]}


OFF = {"buffer_size": 10, "device": "cpu", "seed": 0}
ON = {"n_steps": 8, "batch_size": 8, "device": "cpu", "seed": 0}
EPS = {"exploration_final_eps": 0.5}  # half the sampled rows explore


@dataclass(frozen=True)
class Family:
    """One model to build, and the VecNormalize to train behind (None: no statistics)."""

    make: Callable[[Any], BaseAlgorithm]
    env: Callable[[], gym.Env[Any, Any]]
    vecnormalize: dict[str, Any] | None = None


FAMILIES: dict[str, Family] = {
    "ppo": Family(lambda env: PPO("MlpPolicy", env, policy_kwargs=small(), **ON), VectorEnv),
    "ppo-discrete": Family(lambda env: PPO("MlpPolicy", env, policy_kwargs=small(), **ON), lambda: VectorEnv(True)),
    "ppo-gsde-expln-squash": Family(
        lambda env: PPO("MlpPolicy", env, use_sde=True, policy_kwargs=small(use_expln=True, squash_output=True), **ON),
        VectorEnv,
    ),
    "a2c-gsde-one-std": Family(
        lambda env: A2C("MlpPolicy", env, use_sde=True, policy_kwargs=small(full_std=False), n_steps=8, device="cpu"),
        VectorEnv,
        vecnormalize={},
    ),
    "trpo": Family(lambda env: TRPO("MlpPolicy", env, policy_kwargs=small(), **ON), VectorEnv),
    "ppo-cnn": Family(lambda env: PPO("CnnPolicy", env, policy_kwargs=cnn(), **ON), ImageEnv),
    "ppo-dict-vecnormalize": Family(
        lambda env: PPO("MultiInputPolicy", env, policy_kwargs=multi(), **ON),
        DictEnv,
        vecnormalize={"norm_obs_keys": ["a", "vec"]},
    ),
    "dqn": Family(lambda env: DQN("MlpPolicy", env, policy_kwargs=small(), **EPS, **OFF), lambda: VectorEnv(True)),
    "dqn-cnn": Family(lambda env: DQN("CnnPolicy", env, policy_kwargs=cnn(), **EPS, **OFF), ImageEnv),
    "dqn-dict": Family(lambda env: DQN("MultiInputPolicy", env, policy_kwargs=multi(), **EPS, **OFF), lambda: DictEnv(True)),
    "qrdqn": Family(
        lambda env: QRDQN("MlpPolicy", env, policy_kwargs=small(n_quantiles=5), **EPS, **OFF),
        lambda: VectorEnv(True),
        vecnormalize={},
    ),
    "qrdqn-cnn": Family(lambda env: QRDQN("CnnPolicy", env, policy_kwargs=cnn(n_quantiles=3), **OFF), ImageEnv),
    "td3": Family(lambda env: TD3("MlpPolicy", env, policy_kwargs=small(), **OFF), VectorEnv),
    "ddpg-vecnormalize": Family(lambda env: DDPG("MlpPolicy", env, policy_kwargs=small(), **OFF), VectorEnv, vecnormalize={}),
    "td3-dict": Family(lambda env: TD3("MultiInputPolicy", env, policy_kwargs=multi(), **OFF), DictEnv),
    "sac": Family(lambda env: SAC("MlpPolicy", env, policy_kwargs=small(), **OFF), VectorEnv, vecnormalize={}),
    "sac-gsde": Family(lambda env: SAC("MlpPolicy", env, use_sde=True, policy_kwargs=small(), **OFF), VectorEnv),
    "sac-cnn": Family(lambda env: SAC("CnnPolicy", env, policy_kwargs=cnn(net_arch=[8]), **OFF), lambda: ImageEnv(False)),
    "sac-dict-vecnormalize": Family(
        lambda env: SAC("MultiInputPolicy", env, policy_kwargs={"net_arch": [8]}, **OFF),
        VectorDictEnv,
        vecnormalize={"norm_obs_keys": ["observation"]},
    ),
    "tqc": Family(lambda env: TQC("MlpPolicy", env, policy_kwargs=small(), **OFF), VectorEnv),
    "tqc-gsde-unclipped": Family(
        lambda env: TQC("MlpPolicy", env, use_sde=True, policy_kwargs=small(clip_mean=0.0, use_expln=True), **OFF),
        VectorEnv,
    ),
    "ars": Family(lambda env: ARS("MlpPolicy", env, policy_kwargs=small(), device="cpu", seed=0), VectorEnv),
    "ars-discrete": Family(lambda env: ARS("MlpPolicy", env, policy_kwargs=small(), device="cpu"), lambda: VectorEnv(True)),
    "ars-linear": Family(lambda env: ARS("LinearPolicy", env, device="cpu"), lambda: VectorEnv(True)),
    # ARSLinearPolicy unsquashed, each way sb3-contrib < 1.7 saved it as a bare Linear (test_ars_1x_layout_*).
    "ars-linear-bias-vecnormalize": Family(
        lambda env: ARS("LinearPolicy", env, policy_kwargs={"with_bias": True}, device="cpu"),
        lambda: VectorEnv(True),
        vecnormalize={},
    ),
    "ars-linear-box-vecnormalize": Family(lambda env: ARS("LinearPolicy", env, device="cpu"), VectorEnv, vecnormalize={}),
    "ars-linear-box-bias": Family(
        lambda env: ARS("LinearPolicy", env, policy_kwargs={"with_bias": True}, device="cpu"), VectorEnv
    ),
    "ars-linear-bias-squash": Family(
        lambda env: ARS("LinearPolicy", env, policy_kwargs={"with_bias": True, "squash_output": True}, device="cpu"),
        VectorEnv,
        vecnormalize={},
    ),
    # Constructor options, each against SB3's own network.
    "ars-mlp-no-bias-unsquashed": Family(
        lambda env: ARS("MlpPolicy", env, policy_kwargs=small(with_bias=False, squash_output=False), device="cpu"), VectorEnv
    ),
    "ppo-separate-heads-silu": Family(
        lambda env: PPO(
            "MlpPolicy", env, policy_kwargs={"net_arch": {"pi": [16, 8], "vf": [4]}, "activation_fn": torch.nn.SiLU}, **ON
        ),
        VectorEnv,
    ),
    "ppo-cnn-separate-extractors-unnormalized": Family(
        lambda env: PPO("CnnPolicy", env, policy_kwargs=cnn(share_features_extractor=False, normalize_images=False), **ON),
        ImageEnv,
    ),
    "ppo-dict-unnormalized-images": Family(
        lambda env: PPO("MultiInputPolicy", env, policy_kwargs={**multi(), "normalize_images": False}, **ON),
        lambda: DictEnv(True),
    ),
    "dqn-cnn-unnormalized-elu": Family(
        lambda env: DQN("CnnPolicy", env, policy_kwargs=cnn(normalize_images=False, activation_fn=torch.nn.ELU), **EPS, **OFF),
        ImageEnv,
    ),
    "sac-pi-qf-shared-cnn": Family(
        lambda env: SAC(
            "CnnPolicy", env, policy_kwargs=cnn(net_arch={"pi": [8], "qf": [4]}, share_features_extractor=True), **OFF
        ),
        lambda: ImageEnv(False),
    ),
    "td3-pi-qf-leaky": Family(
        lambda env: TD3(
            "MlpPolicy", env, policy_kwargs={"net_arch": {"pi": [16], "qf": [4]}, "activation_fn": torch.nn.LeakyReLU}, **OFF
        ),
        VectorEnv,
    ),
    "crossq": Family(lambda env: CrossQ("MlpPolicy", env, policy_kwargs=small(), **OFF), VectorEnv, vecnormalize={}),
    "crossq-gelu-eps-pi-qf": Family(
        lambda env: CrossQ(
            "MlpPolicy",
            env,
            policy_kwargs={"net_arch": {"pi": [16], "qf": [8]}, "activation_fn": torch.nn.GELU, "batch_norm_eps": 0.1},
            **OFF,
        ),
        VectorEnv,
    ),
    "crossq-gsde": Family(lambda env: CrossQ("MlpPolicy", env, use_sde=True, policy_kwargs=small(), **OFF), VectorEnv),
    "crossq-without-batch-norm": Family(
        lambda env: CrossQ("MlpPolicy", env, policy_kwargs=small(batch_norm=False), **OFF), VectorEnv
    ),
}


def redraw(model: BaseAlgorithm, seed: int = 0) -> None:
    """Every weight from N(0, 1); batch norm statistics too (means N(0, 1), variances in [0.1, 4])."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.policy.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))
        for name, buffer in model.policy.named_buffers():
            if name.endswith("ra_mean"):
                buffer.copy_(torch.randn(buffer.shape, generator=gen))
            elif name.endswith("ra_var"):
                buffer.copy_(torch.rand(buffer.shape, generator=gen) * 3.9 + 0.1)


@dataclass
class Saved:
    name: str
    model: BaseAlgorithm
    zip: Path
    venv: VecNormalize | None


def save_family(name: str, folder: Path) -> Saved:
    """The family's model, weights redrawn, saved as `folder/model.zip`, with its VecNormalize
    statistics beside it (a Hugging Face repository's layout) where it has them."""
    family = FAMILIES[name]
    folder.mkdir(parents=True, exist_ok=True)
    venv = None
    env: Any = family.env()
    if family.vecnormalize is not None:
        venv = VecNormalize(DummyVecEnv([family.env]), **family.vecnormalize)
        venv.seed(0)
        venv.action_space.seed(0)
        venv.reset()
        for _ in range(20):  # real statistics, not the initial zeros and ones
            venv.step(np.array([venv.action_space.sample()]))
        venv.training = False
        env = venv
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = family.make(env)
    redraw(model)
    model.save(folder / "model.zip")
    if venv is not None:
        venv.save(folder / "vec_normalize.pkl")
    return Saved(name, model, folder / "model.zip", venv)


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    return save_family(request.param, tmp_path_factory.mktemp(request.param))


def observations(saved: Saved, policy: PolicyNet) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """Observations as the environment gives them (SB3's input) and as the harness's inputs."""
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    space = saved.model.observation_space
    if isinstance(space, gym.spaces.Dict):
        raw: Any = {inp.name: o for inp, o in zip(policy.info.inputs, batch.obs, strict=True)}
    else:
        raw = batch.obs[0].reshape(ROWS, *space.shape)
    return raw, tuple(torch.from_numpy(o) for o in batch.obs)


def sb3_input(saved: Saved, raw: Any) -> Any:
    """What SB3's policy is handed: the observation normalized by VecNormalize where it trained behind one."""
    return saved.venv.normalize_obs(raw) if saved.venv is not None else raw


def sb3_tensor(saved: Saved, raw: Any) -> Any:
    obs, _ = saved.model.policy.obs_to_tensor(sb3_input(saved, raw))
    return obs


def sb3_head(saved: Saved, obs: Any) -> torch.Tensor:
    """The output the harness calls the head, as SB3's own modules compute it (in eval mode, as
    predict runs them: CrossQ's batch norms from their running statistics)."""
    policy: Any = saved.model.policy
    policy.set_training_mode(False)
    with torch.no_grad():
        if hasattr(policy, "action_net") and hasattr(policy, "mlp_extractor"):  # ActorCriticPolicy
            # BaseModel's: ActorCriticPolicy's own gives (pi, vf) where the extractors are separate.
            features = BaseModel.extract_features(policy, obs, policy.pi_features_extractor)
            return policy.action_net(policy.mlp_extractor.forward_actor(features))
        if hasattr(policy, "q_net"):
            return policy.q_net(obs)
        if hasattr(policy, "quantile_net"):
            return policy.quantile_net(obs).mean(dim=1)
        if hasattr(policy, "action_net"):  # ARS: the last Linear, before any Tanh
            net = policy.action_net[:-1] if isinstance(policy.action_net[-1], torch.nn.Tanh) else policy.action_net
            return net(policy.extract_features(obs, policy.features_extractor))
        actor = policy.actor
        if hasattr(actor, "latent_pi"):  # SAC, TQC: mean_actions
            return actor.get_action_dist_params(obs)[0]
        return actor.mu[:-1](actor.extract_features(obs, actor.features_extractor))  # TD3: before its Tanh


def sb3_sample(saved: Saved, obs: Any, raw: Any, noise: torch.Tensor) -> np.ndarray:
    """SB3's stochastic action given the harness's noise, as its predict(deterministic=False) returns it."""
    model: Any = saved.model
    policy = model.policy
    kind = type(model).__name__
    with torch.no_grad():
        if kind in ("PPO", "A2C", "TRPO"):
            dist = policy.get_distribution(obs)
            if policy.use_sde:
                policy.action_dist.exploration_matrices = noise * policy.action_dist.get_std(policy.log_std)
                return policy.predict(sb3_input(saved, raw), deterministic=False)[0]
            if policy.action_space.shape == ():  # Gumbel-max over SB3's own logits
                return torch.argmax(dist.distribution.logits + noise, dim=-1).numpy()
            sample = dist.distribution.mean + noise * dist.distribution.stddev
            return np.clip(sample.numpy(), policy.action_space.low, policy.action_space.high)
        if kind in ("SAC", "TQC", "CrossQ"):
            actor = policy.actor
            if actor.use_sde:
                actor.action_dist.exploration_matrices = noise * actor.get_std()
                return policy.predict(sb3_input(saved, raw), deterministic=False)[0]
            mean, log_std, _ = actor.get_action_dist_params(obs)
            gaussian = actor.action_dist.proba_distribution(mean, log_std).distribution
            return policy.unscale_action(torch.tanh(gaussian.mean + noise * gaussian.stddev).numpy())
        if kind in ("DQN", "QRDQN"):
            greedy = policy.predict(sb3_input(saved, raw), deterministic=True)[0]
            explore = noise.max(dim=-1)
            return np.where(explore.values.numpy() == EXPLORE, explore.indices.numpy(), greedy)
        return policy.predict(sb3_input(saved, raw), deterministic=False)[0]  # TD3, DDPG, ARS: deterministic


def max_diff(a: Any, b: Any) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


def test_matches_sb3_head_action_and_sample(saved: Saved) -> None:
    policy = load_sb3_zip(saved.zip)
    raw, ours_in = observations(saved, policy)
    obs = sb3_tensor(saved, raw)
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    noise = torch.from_numpy(batch.noise)
    outputs = forward_outputs(policy, ours_in, noise)
    head = outputs[head_name(policy)]
    expected = sb3_head(saved, obs)
    scale = max(1.0, float(expected.abs().max()))
    assert max_diff(head, expected) <= ATOL * scale, (saved.name, max_diff(head, expected), scale)

    predicted = saved.model.predict(sb3_input(saved, raw), deterministic=True)[0]
    sampled = sb3_sample(saved, obs, raw, noise)
    action, stochastic = outputs["action"].numpy(), outputs["stochastic_action"].numpy()
    space = saved.model.action_space
    if isinstance(space, gym.spaces.Box):  # SB3's predict clips what it does not squash, as the harness's episodes do
        action, stochastic = (np.clip(a, space.low, space.high) for a in (action, stochastic))
        assert max_diff(action, predicted) <= ATOL * max(1.0, float(np.abs(predicted).max())), saved.name
        assert max_diff(stochastic, sampled) <= ATOL * max(1.0, float(np.abs(sampled).max())), saved.name
    else:
        assert np.array_equal(action, predicted) and np.array_equal(stochastic, sampled), saved.name
    if policy.info.sampling.kind is SamplingKind.DETERMINISTIC:
        assert np.array_equal(outputs["action"], outputs["stochastic_action"])


def test_inputs_are_the_observation_spaces_keys_in_order(saved: Saved) -> None:
    info = load_sb3_zip(saved.zip).info
    space = saved.model.observation_space
    if isinstance(space, gym.spaces.Dict):
        assert [i.name for i in info.inputs] == list(space.spaces)
        assert [i.shape for i in info.inputs] == [s.shape for s in space.spaces.values()]
    else:
        assert [i.name for i in info.inputs] == ["obs"]
    images = [i for i in info.inputs if len(i.shape) == 3]
    assert all(i.dtype == "uint8" and i.shape[0] in (1, 3) for i in images), "channels first, as SB3's policy sees them"
    assert info.detail.startswith("SB3 2.") and type(saved.model.policy).__name__ in info.detail


def test_layers_take_the_card_dtype_and_preprocessing_stays_float32(saved: Saved) -> None:
    policy = load_sb3_zip(saved.zip)
    half = cast_policy(policy, "float16")
    assert {p.dtype for name, p in half.named_parameters()} == {torch.float16}
    kept = {name: b.dtype for name, b in half.named_buffers() if b.is_floating_point()}
    assert set(kept.values()) <= {torch.float32}, kept
    _, obs = observations(saved, policy)
    with torch.inference_mode():
        out = half(*obs)
        golden = cast_policy(policy, GOLDEN_DTYPE)(*obs)
    assert out.dtype == torch.float32 and golden.dtype == torch.float64
    assert bool(torch.isfinite(golden).all())


def test_every_layer_is_captured_by_name(saved: Saved) -> None:
    policy = load_sb3_zip(saved.zip)
    _, obs = observations(saved, policy)
    acts = capture_activations(policy, obs)
    names = list(acts)
    assert names[-1].startswith("head") and any(n.startswith("body") or n.startswith("features") for n in names)
    if policy.features is not None:
        assert any(n.startswith("features.") for n in names)
    if policy.normalizer is not None:
        assert names[0] == "normalizer"
    with torch.inference_mode():
        np.testing.assert_array_equal(acts[names[-1]], policy(*obs).numpy())


@pytest.mark.parametrize(("name", "layer"), [("ppo-cnn", "features.cnn.0"), ("dqn-dict", "features.extractors.img.cnn.0")])
def test_a_perturbed_convolution_is_the_layer_named(name: str, layer: str, tmp_path: Path) -> None:
    policy = load_sb3_zip(save_family(name, tmp_path).zip)
    card = copy.deepcopy(policy)
    with torch.no_grad():
        card.get_submodule(layer).bias[0] += 1e-3
    obs = tuple(torch.from_numpy(o) for o in make_batch(policy.info, "uniform", ROWS, 3).obs)
    div = first_divergent_layer(capture_activations(card, obs), capture_activations(policy, obs), modules=layer_modules(card))
    assert div is not None and div.layer == layer and div.module.startswith("Conv2d(")


def test_gsde_noise_is_an_exploration_matrix_per_row(tmp_path: Path) -> None:
    policy = load_sb3_zip(save_family("sac-gsde", tmp_path).zip)
    batch = make_batch(policy.info, "normal", 5, 0)
    assert batch.noise.shape == (5, 8, 2)  # latent_pi's last layer (8) x actions
    assert policy.info.sampling.kind is SamplingKind.STATE_DEPENDENT and policy.log_sigma is not None


def test_epsilon_greedy_explores_at_the_saves_final_rate(tmp_path: Path) -> None:
    policy = load_sb3_zip(save_family("dqn", tmp_path).zip)
    assert (policy.info.sampling.epsilon, policy.info.sampling.source) == (0.5, "exploration_final_eps")
    noise = make_batch(policy.info, "normal", 4000, 0).noise
    explored = (noise == EXPLORE).any(axis=1)
    assert abs(explored.mean() - 0.5) < 0.05 and set(np.unique(noise).tolist()) == {0.0, np.float32(EXPLORE)}
    assert head_name(policy) == "q_values"


# Refusals: each one line naming the file and what is wrong.


def refused(path: Path, *words: str, named: Path | None = None) -> str:
    """The one-line error loading `path` gives, naming the file at fault (`named`, else `path`)."""
    with pytest.raises(PolicyLoadError) as caught:
        load_policy(str(path))
    message = str(caught.value)
    assert message.startswith(f"{named or path}: ") and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def _edit(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for member in zin.namelist():
            content = zin.read(member)
            if member == "data":
                data = json.loads(content)
                edit(data)
                content = json.dumps(data).encode()
            zout.writestr(member, content)
    return dst


class Custom(BaseFeaturesExtractor):
    def __init__(self, observation_space: gym.Space[Any]) -> None:
        super().__init__(observation_space, 4)
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.linear(x))


def test_a_custom_features_extractor_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "custom.zip"
    PPO("MlpPolicy", VectorEnv(), policy_kwargs={"features_extractor_class": Custom}, **ON).save(path)
    refused(path, "features extractor tests.test_sb3_families.Custom is not supported", "FlattenExtractor, NatureCNN")


def test_an_unknown_policy_class_is_refused_with_what_is_supported(tmp_path: Path) -> None:
    src = save_family("td3", tmp_path / "td3").zip

    def rename(data: dict[str, Any]) -> None:
        data["policy_class"]["__module__"] = "my_project.policies"

    refused(_edit(src, tmp_path / "mine.zip", rename), "TD3Policy (my_project.policies) is not supported", "supported: PPO")


def test_observation_and_action_spaces_it_cannot_take_are_refused(tmp_path: Path) -> None:
    frozen = tmp_path / "frozen.zip"
    DQN("MlpPolicy", "FrozenLake-v1", **OFF).save(frozen)
    refused(frozen, "observation space <class 'gymnasium.spaces.discrete.Discrete'> is not supported")
    flat_image = tmp_path / "flat-image.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PPO("MlpPolicy", ImageEnv(), **ON).save(flat_image)
    refused(flat_image, "image observations", "use CnnPolicy")
    src = save_family("sac", tmp_path / "sac").zip

    def unbounded(data: dict[str, Any]) -> None:
        data["action_space"]["low"] = "[-inf -1.]"

    refused(_edit(src, tmp_path / "unbounded.zip", unbounded), "no finite bounds")


def test_weights_that_do_not_fit_the_declared_network_are_refused(tmp_path: Path) -> None:
    sac = save_family("sac-gsde", tmp_path / "sac").zip
    refused(_edit(sac, tmp_path / "not-sde.zip", lambda d: d.update(use_sde=False)), "use_sde False", "gSDE parameter")
    gsde = save_family("ppo-gsde-expln-squash", tmp_path / "ppo").zip
    one_std = _edit(gsde, tmp_path / "one-std.zip", lambda d: d["policy_kwargs"].update(full_std=False))
    refused(one_std, "log_std is shape (8, 2)", "expects (8, 1)")
    dqn = save_family("dqn", tmp_path / "dqn").zip
    refused(_edit(dqn, tmp_path / "arch.zip", lambda d: d["policy_kwargs"].update(net_arch=[16])), "hidden layers [16, 8]")
    refused(_edit(dqn, tmp_path / "eps.zip", lambda d: d.pop("exploration_final_eps")), "exploration_final_eps is None")


def test_vecnormalize_that_does_not_fit_the_observation_is_refused(tmp_path: Path) -> None:
    saved = save_family("ppo-dict-vecnormalize", tmp_path / "dict")
    assert saved.venv is not None
    saved.venv.norm_obs_keys = ["img"]
    saved.venv.obs_rms = {"img": saved.venv.obs_rms["vec"]}
    saved.venv.save(saved.zip.parent / "vec_normalize.pkl")
    stats = saved.zip.parent / "vec_normalize.pkl"
    refused(saved.zip, "normalizes the image 'img': not supported", named=stats)
    box = save_family("sac", tmp_path / "box")
    (box.zip.parent / "vec_normalize.pkl").replace(stats)
    refused(saved.zip, "normalizes a Box, but model.zip takes a Dict observation", named=stats)


# The ONNX export of every family, against the harness's own float32 policy.


@dataclass
class ExportError:
    """An export's outputs against the harness's float32 policy on one batch, and the limit."""

    head: float
    action: float
    limit: float
    same_greedy: bool


def export_error(policy: PolicyNet, path: Path, kind: str, rows: int) -> ExportError:
    """onnxruntime on `path` against `policy`'s float32 outputs. onnxruntime's kernels round
    otherwise than torch's, so the limit is float32's own error of the float64 golden on this
    batch (the port rule's idea), doubled, or 1e-5 of the head's scale."""
    session = onnxruntime.InferenceSession(str(path))
    head = policy.head_output()
    batch = make_batch(policy.info, kind, rows, 5)
    feeds = {i.name: o.astype(np.float32) for i, o in zip(policy.info.inputs, batch.obs, strict=True)}
    got = dict(zip([head, "deterministic_actions"], session.run(None, feeds), strict=True))
    obs = tuple(torch.from_numpy(o) for o in batch.obs)
    ours = forward_outputs(policy, obs, torch.from_numpy(batch.noise))
    golden = forward_outputs(cast_policy(policy, GOLDEN_DTYPE), obs, torch.from_numpy(batch.noise))
    limit = max(ATOL * max(1.0, float(ours[head].abs().max())), 2 * max_diff(ours[head], golden[head]))
    # tanh and the bounds shrink an error, never grow it past the bounds' span
    span = 1.0 if policy.action_low is None else float((policy.action_high - policy.action_low).max())
    same = policy.info.action_kind != "discrete" or np.array_equal(got["deterministic_actions"], ours["action"].numpy())
    action = max_diff(got["deterministic_actions"], ours["action"]) / max(1.0, span)
    return ExportError(max_diff(got[head], ours[head]), action, limit, same)


def test_export_matches_the_policy_through_onnxruntime(saved: Saved, tmp_path: Path) -> None:
    """One input per observation input (float32, images holding 0-255), the head as a sweep names
    it and the deterministic action, VecNormalize folded in: onnxruntime on the file gives the
    harness's float32 outputs (and the greedy action: no near-tie among these rows)."""
    policy = load_sb3_zip(saved.zip)
    path = tmp_path / "policy.onnx"
    export_onnx(policy, path)
    session = onnxruntime.InferenceSession(str(path))
    assert [i.name for i in session.get_inputs()] == [i.name for i in policy.info.inputs]
    assert [o.name for o in session.get_outputs()] == [policy.head_output(), "deterministic_actions"]
    for kind, rows in (("uniform", ROWS), ("normal", 1)):
        error = export_error(policy, path, kind, rows)
        assert error.head <= error.limit and error.action <= error.limit and error.same_greedy, (saved.name, error)


def test_an_export_with_a_constant_off_fails_the_comparison(tmp_path: Path) -> None:
    """The comparison can fail: one VecNormalize mean moved by 1e-3 in the file, or batch norm's
    epsilon written as its default, and the export no longer computes the policy."""
    for name, initializer, edit in (
        ("ddpg-vecnormalize", "normalizer.0.running_mean", lambda a: a + np.float32(1e-3) * (np.arange(a.size) == 0)),
        ("crossq-gelu-eps-pi-qf", None, None),
    ):
        policy = load_sb3_zip(save_family(name, tmp_path / name).zip)
        path = tmp_path / f"{name}.onnx"
        export_onnx(policy, path)
        model = onnx.load(path)
        if initializer is not None and edit is not None:
            tensor = next(t for t in model.graph.initializer if t.name == initializer)
            tensor.CopyFrom(onnx.numpy_helper.from_array(edit(onnx.numpy_helper.to_array(tensor)), initializer))
        else:  # batch_norm_eps 0.1 written as BatchRenorm's default 0.001
            for node in model.graph.node:
                for attribute in node.attribute:
                    if node.op_type == "BatchNormalization" and attribute.name == "epsilon":
                        attribute.f = 0.001
        onnx.save(model, path)
        error = export_error(policy, path, "uniform", ROWS)
        assert error.head > error.limit, (name, error)


# Every activation SB3 users pass, and the options the loader must refuse rather than misread.


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_every_activation_matches_sb3_and_its_export(activation: str, tmp_path: Path) -> None:
    """PPO over a Box of actions, built by SB3 with `activation_fn` this torch.nn class: the
    harness's head equals SB3's, and so does the export's."""
    env = VectorEnv()
    model = PPO("MlpPolicy", env, policy_kwargs={"net_arch": [16, 8], "activation_fn": ACTIVATIONS[activation]}, **ON)
    redraw(model, seed=len(activation))
    model.save(tmp_path / "model.zip")
    saved = Saved(activation, model, tmp_path / "model.zip", None)
    policy = load_sb3_zip(saved.zip)
    assert f", {activation}, pi [16, 8]" in policy.info.detail
    raw, ours_in = observations(saved, policy)
    raw = raw * 4  # past the uniform bounds: every piece of every activation (Softplus's threshold at 20 too)
    ours_in = (ours_in[0] * 4,)
    expected = sb3_head(saved, sb3_tensor(saved, raw))
    with torch.no_grad():
        head = policy(*ours_in)
    scale = max(1.0, float(expected.abs().max()))
    assert max_diff(head, expected) <= ATOL * scale, (activation, max_diff(head, expected))
    export_onnx(policy, tmp_path / "model.onnx")
    mu = onnxruntime.InferenceSession(str(tmp_path / "model.onnx")).run(["mu"], {"obs": raw.astype(np.float32)})[0]
    assert max_diff(mu, expected) <= ATOL * scale, (activation, max_diff(mu, expected))


def test_an_activation_with_arguments_of_its_own_is_refused(tmp_path: Path) -> None:
    """functools.partial(LeakyReLU, negative_slope=0.2) is another activation than LeakyReLU: refused
    whether data holds it readably or only in its pickle, never read as the plain class."""
    path = tmp_path / "partial.zip"
    leaky = functools.partial(torch.nn.LeakyReLU, negative_slope=0.2)
    PPO("MlpPolicy", VectorEnv(), policy_kwargs={"net_arch": [8], "activation_fn": leaky}, **ON).save(path)
    refused(path, "unknown activation functools.partial(<class 'torch.nn.modules.activation.LeakyReLU'>")
    pickled = _edit(path, tmp_path / "pickled.zip", lambda d: d["policy_kwargs"].pop("activation_fn"))
    refused(pickled, "activation_fn is pickled in a form this loader cannot read")


def test_policy_kwargs_that_may_change_the_network_are_refused_by_name(tmp_path: Path) -> None:
    src = save_family("sac", tmp_path / "sac").zip
    for key, value, words in (
        ("dueling", True, ("policy_kwargs dueling=True may change the network", "known: net_arch, activation_fn")),
        ("hidden_dropout", 0.1, ("policy_kwargs hidden_dropout=0.1 may change the network",)),
        ("sde_net_arch", [8], ("policy_kwargs sde_net_arch=[8] may change the network",)),
        ("features_extractor_kwargs", {"features_dim": 4, "activation": "ReLU"}, ("features_extractor_kwargs activation",)),
    ):
        edited = _edit(src, tmp_path / f"{key}.zip", lambda d, k=key, v=value: d["policy_kwargs"].update({k: v}))
        refused(edited, *words)
    # What does not change the actor's forward loads, recorded in the detail with its value: where
    # training placed it (the RL Zoo's SAC Pendulum holds device), the initialization, the
    # optimizer, the critics.
    harmless = {
        "device": "cpu",
        "ortho_init": False,
        "log_std_init": -1.0,
        "optimizer_kwargs": {"eps": 1e-5},
        "n_critics": 3,
        "sde_net_arch": None,
    }
    policy = load_policy(str(_edit(src, tmp_path / "harmless.zip", lambda d: d["policy_kwargs"].update(harmless))))
    assert torch.equal(policy.head.weight, load_sb3_zip(src).head.weight)
    recorded = "device=cpu, ortho_init=False, log_std_init=-1.0, optimizer_kwargs={'eps': 1e-05}, n_critics=3"
    assert policy.info.detail.endswith(f", policy_kwargs not in the forward: {recorded}"), policy.info.detail
    assert "not in the forward" not in load_sb3_zip(src).info.detail


# What the algorithm hands a policy's constructor itself: never a policy_kwargs key.
FROM_THE_ALGORITHM = ("self", "observation_space", "action_space", "lr_schedule")


def unsorted_parameters(classes: list[type]) -> list[str]:
    """Each constructor parameter of `classes` that options.READ, options.NOT_IN_THE_FORWARD and
    FROM_THE_ALGORITHM leave out, as "Class.parameter"."""
    known = {*READ, *NOT_IN_THE_FORWARD, *FROM_THE_ALGORITHM}
    return [
        f"{cls.__name__}.{name}" for cls in classes for name in inspect.signature(cls.__init__).parameters if name not in known
    ]


def test_every_constructor_parameter_of_every_policy_class_read_is_sorted() -> None:
    """Each parameter of each class the loader reads either decides the actor's forward (READ, and
    its family reads it) or is known not to (NOT_IN_THE_FORWARD): decided from the installed SB3's
    and sb3-contrib's constructors, so that a release adding an option fails here, not in a sweep."""
    classes = [getattr(importlib.import_module(c.module), c.name) for c in sb3_zip.FAMILIES]
    assert len(classes) == len(sb3_zip.FAMILIES) and not set(READ) & set(NOT_IN_THE_FORWARD)
    assert unsorted_parameters(classes) == []

    class Newer(ActorCriticPolicy):  # a release's new option; **kwargs would hide options, so it is unsorted too
        def __init__(
            self, observation_space: Any, action_space: Any, lr_schedule: Any, layer_norm: bool, **kwargs: Any
        ) -> None:
            super().__init__(observation_space, action_space, lr_schedule, **kwargs)

    assert unsorted_parameters([Newer]) == ["Newer.layer_norm", "Newer.kwargs"]


def ars_1x(saved: Saved, folder: Path) -> Path:
    """`saved` as sb3-contrib < 1.7 wrote an unsquashed ARSLinearPolicy: its action_net.0.* as
    action_net.*, its VecNormalize statistics beside it."""
    folder.mkdir()
    state = torch.load(io.BytesIO(zipfile.ZipFile(saved.zip).read("policy.pth")), weights_only=True)
    assert set(state) <= {"action_net.0.weight", "action_net.0.bias"}, "a bare Linear in 1.x"
    buffer = io.BytesIO()
    torch.save({k.replace("action_net.0.", "action_net."): v for k, v in state.items()}, buffer)
    if saved.venv is not None:
        shutil.copy(saved.zip.parent / "vec_normalize.pkl", folder)
    return rewrite_zip(saved.zip, folder / "model.zip", **{"policy.pth": buffer.getvalue()})


@pytest.mark.parametrize(
    "name", ["ars-linear", "ars-linear-bias-vecnormalize", "ars-linear-box-vecnormalize", "ars-linear-box-bias"]
)
def test_ars_1x_layout_loads_as_sb3_contrib_loads_it(name: str, tmp_path: Path) -> None:
    """sb3-contrib's ARS.load renames action_net.weight and .bias to action_net.0.*: the harness
    reads the same layer, with or without its bias, Discrete or Box, behind VecNormalize or not,
    and acts as sb3-contrib's predict on the old file; its detail says which layout it read."""
    saved = save_family(name, tmp_path / "new")
    old = ars_1x(saved, tmp_path / "old")
    policy, new = load_sb3_zip(old), load_sb3_zip(saved.zip)
    assert ", sb3-contrib < 1.7 layout (action_net.weight)" in policy.info.detail
    assert "1.7" not in new.info.detail and (policy.normalizer is None) == (saved.venv is None)
    assert torch.equal(policy.head.weight, new.head.weight) and (policy.head.bias is None) == ("bias" not in name)
    raw, obs = observations(saved, policy)
    batch = make_batch(policy.info, "uniform", ROWS, 3)
    action = forward_outputs(policy, obs, torch.from_numpy(batch.noise))["action"].numpy()
    predicted = ARS.load(old, device="cpu").predict(sb3_input(saved, raw), deterministic=True)[0]
    space = saved.model.action_space
    if isinstance(space, gym.spaces.Box):
        assert max_diff(np.clip(action, space.low, space.high), predicted) <= ATOL * max(1.0, float(np.abs(predicted).max()))
    else:
        assert np.array_equal(action, predicted)


def test_an_ars_save_of_neither_layout_is_refused(tmp_path: Path) -> None:
    saved = save_family("ars-linear", tmp_path / "new")
    old = ars_1x(saved, tmp_path / "old")
    state = torch.load(io.BytesIO(zipfile.ZipFile(old).read("policy.pth")), weights_only=True)
    for label, edited, words in (
        ("both", {**state, "action_net.0.weight": state["action_net.weight"]}, ("has both action_net.weight",)),
        ("wide", {"action_net.weight": torch.zeros(3, 5)}, ("action_net.weight is shape (3, 5)", "expects (3, 3)")),
        ("bias-only", {"action_net.bias": torch.zeros(3)}, ("action_net does not end in a layer of 3 actions",)),
    ):
        buffer = io.BytesIO()
        torch.save(edited, buffer)
        refused(rewrite_zip(old, tmp_path / f"{label}.zip", **{"policy.pth": buffer.getvalue()}), *words)


def test_crossq_batch_norms_that_do_not_fit_data_are_refused(tmp_path: Path) -> None:
    src = save_family("crossq", tmp_path / "crossq").zip
    off = _edit(src, tmp_path / "off.zip", lambda d: d["policy_kwargs"].update(batch_norm=False))
    refused(off, "data says batch_norm False, but policy.pth holds batch renormalization layers")
    plain = save_family("crossq-without-batch-norm", tmp_path / "plain").zip
    on = _edit(plain, tmp_path / "on.zip", lambda d: d["policy_kwargs"].update(batch_norm=True))
    refused(on, "data says batch_norm True, but policy.pth holds no batch renormalization layers")


def test_crossq_batch_norms_keep_their_statistics_float32_on_a_card(tmp_path: Path) -> None:
    """The statistics of CrossQ's first batch norm are the raw observation's: a variance past
    float16's 65504 would be inf in float16 and zero its feature. Kept float32, the float16 policy
    stays within float16's rounding of the golden; the same policy with that layer's variance
    cast through float16 (what `.half()` of the whole network does) does not."""
    saved = save_family("crossq-gelu-eps-pi-qf", tmp_path)  # no VecNormalize: the batch norm sees the observation
    policy = load_sb3_zip(saved.zip)
    assert policy.normalizer is None
    first = policy.body[0]
    with torch.no_grad():
        first.running_var.mul_(1e6)  # variances of 1e5 to 4e6
        first.running_mean.mul_(1e3)
    _, obs = observations(saved, policy)
    obs = (obs[0] * 1e3,)  # observations on that scale
    with torch.inference_mode():
        golden = cast_policy(policy, GOLDEN_DTYPE)(*obs)
        half = cast_policy(policy, "float16")
        assert {b.dtype for b in half.body[0].buffers()} == {torch.float32}
        out = half(*obs)
        half.body[0].running_var = half.body[0].running_var.half().float()
        naive = half(*obs)
    bound = 0.05 * max(1.0, float(golden.abs().max()))
    assert bool(torch.isfinite(out).all()) and float((out.double() - golden).abs().max()) <= bound
    assert float((naive.double() - golden).abs().max()) > bound
