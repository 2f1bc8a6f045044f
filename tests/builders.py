"""The files the tests read, built here, so that a clone with nothing beside it tests itself; test
modules import them from this one module, never from each other.

Each builder writes what a real tool writes, with the tool where it is installed: SB3 saves by the
installed Stable-Baselines3 (2.x), also rewritten into the 1.x layout (`to_sb3_1x`); RL Zoo run
folders as `rl_zoo3 train` leaves them; ML-Agents exports by the harness's own exporter, which
writes the ML-Agents model version 3 layout; ONNX graphs node by node; a Hugging Face cache as
huggingface_hub lays it out. Two of them stand in for the third-party cases of ../shared/cases
(`sb3_expert`, `mlagents_export`): what a test needs of those files, other than their exact bytes
and the tables measured on them, it gets from these.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pickle
import sys
import types
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnx
import torch
import yaml
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from harness.devices import Device
from harness.inference.runner import Described
from harness.policies.export_onnx import export_onnx
from harness.policies.mlagents import BODY, HEAD, PROCESSORS
from harness.policies.mlagents_pt import load_mlagents_pt
from harness.store.schema import BenchRow

# --- Stable-Baselines3 saves ---------------------------------------------------------------------


def redraw_weights(model: Any, seed: int = 0) -> None:
    """Every parameter of an SB3 model's policy drawn again from N(0, 1): untrained, but its logits
    are large (tens) and every layer matters, so a wrong layer or rounding shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.policy.parameters():
            param.copy_(torch.randn(param.shape, generator=gen))


def save_sb3(model: Any, path: Path, seed: int = 0) -> Path:
    """`model` saved by the installed SB3 after `redraw_weights`."""
    redraw_weights(model, seed)
    model.save(path)
    return path


def rewrite_zip(src: Path, dst: Path, **members: bytes | None) -> Path:
    """Copy an SB3 zip, replacing members (None drops one)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            if name not in members:
                zout.writestr(name, zin.read(name))
        for name, content in members.items():
            if content is not None:
                zout.writestr(name, content)
    return dst


def edit_data(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Copy an SB3 zip with its `data` JSON changed by `edit`."""
    data = json.loads(zipfile.ZipFile(src).read("data"))
    edit(data)
    return rewrite_zip(src, dst, data=json.dumps(data).encode())


# What SB3 2.x writes in `data` that 1.0 did not have; 1.0 kept `_last_dones` where 2.x keeps
# `_last_episode_starts`.
ONLY_IN_SB3_2 = (
    "_last_episode_starts",
    "_num_timesteps_at_start",
    "_stats_window_size",
    "normalize_advantage",
    "rollout_buffer_class",
    "rollout_buffer_kwargs",
)


def to_sb3_1x(src: Path, dst: Path, version: str = "1.0rc0") -> Path:
    """An SB3 2.x save rewritten as SB3 1.x wrote it, the RL Zoo's rl-trained-agents among them.

    Its spaces are *gym* objects (`gym.spaces.box.Box`, not gymnasium's), pickled into
    `:serialized:` with their readable fields beside them in 1.x's names (`shape`, not `_shape`;
    `n` a number, not a string); where gymnasium says inf, gym's CartPole of that time bounded its
    Box with float32's largest value. The zip holds `_stable_baselines3_version` and no
    `system_info.txt`. The weights (`policy.pth`) keep their names: 1.x named them the same.
    """
    with zipfile.ZipFile(src) as zf:
        data = json.loads(zf.read("data"))
    for key in ONLY_IN_SB3_2:
        data.pop(key, None)
    data["_last_dones"] = _serialized(np.zeros(int(data.get("n_envs", 1)), dtype=bool))
    data["observation_space"] = _gym_space(data["observation_space"])
    data["action_space"] = _gym_space(data["action_space"])
    members = {"data": json.dumps(data, indent=4).encode(), "_stable_baselines3_version": version.encode()}
    return rewrite_zip(src, dst, **members, **{"system_info.txt": None})


def _gym_space(space: dict[str, Any]) -> dict[str, Any]:
    kind = space[":type:"]
    dtype = np.dtype(space["dtype"])
    shape = space["_shape"]
    if "spaces.box.Box" in kind:
        low, high = (_float32_bounds(space[bound], shape) for bound in ("low", "high"))
        fields: dict[str, Any] = {"dtype": dtype, "shape": tuple(shape), "low": low, "high": high}
        fields |= {"bounded_below": low > -np.inf, "bounded_above": high < np.inf, "np_random": None}
        # Beside the pickle SB3 writes numpy's str() of each array.
        readable = {"dtype": str(dtype), "shape": shape, "low": str(low), "high": str(high)}
        readable |= {"bounded_below": str(fields["bounded_below"]), "bounded_above": str(fields["bounded_above"])}
        readable["_np_random"] = None
        serialized = _gym_pickle("gym.spaces.box", "Box", fields)
        return {":type:": "<class 'gym.spaces.box.Box'>", ":serialized:": serialized} | readable
    if "spaces.discrete.Discrete" in kind:
        n = int(space["n"])
        fields = {"n": n, "shape": (), "dtype": dtype, "np_random": None}
        readable = {"n": n, "shape": [], "dtype": str(dtype), "_np_random": "RandomState(MT19937)"}
        serialized = _gym_pickle("gym.spaces.discrete", "Discrete", fields)
        return {":type:": "<class 'gym.spaces.discrete.Discrete'>", ":serialized:": serialized} | readable
    raise ValueError(f"no 1.x form for a {kind} here")


def _float32_bounds(text: str, shape: list[int]) -> np.ndarray:
    values = np.array(text.strip("[]").split(), dtype=np.float64).reshape(shape)
    biggest = np.finfo(np.float32).max
    return np.clip(values, -biggest, biggest).astype(np.float32)


def _serialized(value: object) -> dict[str, str]:
    return {":type:": f"<class '{type(value).__module__}.{type(value).__qualname__}'>", ":serialized:": _b64(value)}


def _b64(value: object) -> str:
    return base64.b64encode(pickle.dumps(value, protocol=4)).decode()


def _gym_pickle(module: str, name: str, fields: dict[str, Any]) -> str:
    """base64 of a pickle of a `module.name` object holding `fields`, as cloudpickle wrote gym's
    spaces: the bytes name the class; loading them would import gym (which nothing here does)."""
    cls = type(name, (), {"__module__": module})
    space = cls.__new__(cls)
    space.__dict__.update(fields)
    with _stand_in_modules(module, name, cls):
        return _b64(space)


@contextlib.contextmanager
def _stand_in_modules(module: str, name: str, cls: type) -> Iterator[None]:
    """`module` (and its parents) in sys.modules while pickling, so pickle finds the class by name."""
    parts = module.split(".")
    names = [".".join(parts[: i + 1]) for i in range(len(parts))]
    saved = {n: sys.modules.get(n) for n in names}
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    setattr(sys.modules[module], name, cls)
    try:
        yield
    finally:
        for n, old in saved.items():
            if old is None:
                del sys.modules[n]
            else:
                sys.modules[n] = old


# --- RL Zoo run folders ---------------------------------------------------------------------------


def zoo_yaml(pairs: list[tuple[str, Any]]) -> str:
    """YAML as the RL Zoo writes its run files: `yaml.dump` of an OrderedDict, so it carries the tag
    `!!python/object/apply:collections.OrderedDict` that `yaml.safe_load` refuses."""
    return yaml.dump(OrderedDict(pairs))


# The hyperparameters the RL Zoo's ppo.yml gives CartPole-v1, as its config.yml records them.
CARTPOLE_PPO = [
    ("batch_size", 256),
    ("clip_range", "lin_0.2"),
    ("ent_coef", 0.0),
    ("gae_lambda", 0.8),
    ("gamma", 0.98),
    ("learning_rate", "lin_0.001"),
    ("n_envs", 8),
    ("n_epochs", 20),
    ("n_steps", 32),
    ("n_timesteps", 100000.0),
    ("policy", "MlpPolicy"),
]


def write_zoo_files(folder: Path, env_id: str, hyperparams: list[tuple[str, Any]] | None = None, seed: int = 0) -> Path:
    """`<folder>/<env_id>/args.yml` and `config.yml`, as `rl_zoo3 train` writes them; the run folder."""
    run = folder / env_id
    run.mkdir(parents=True, exist_ok=True)
    (run / "args.yml").write_text(zoo_yaml([("algo", "ppo"), ("env", env_id), ("seed", seed), ("vec_env", "dummy")]))
    (run / "config.yml").write_text(zoo_yaml(hyperparams if hyperparams is not None else CARTPOLE_PPO))
    return run


@dataclass(frozen=True)
class ZooRun:
    """An RL Zoo folder as `rl_zoo3 train` leaves it, and the SB3 objects that wrote it."""

    zip: Path
    stats: Path
    model: Any  # stable_baselines3.PPO
    venv: Any  # VecNormalize


TRAIN_STEPS = 256


def write_zoo_run(folder: Path, env_id: str, norm_obs: bool = True) -> ZooRun:
    """PPO trained for a few hundred steps behind VecNormalize (so the statistics are real), its
    weights then redrawn; saved with vecnormalize.pkl in the RL Zoo layout."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = VecNormalize(DummyVecEnv([lambda: gym.make(env_id)]), norm_obs=norm_obs)
    model = PPO("MlpPolicy", venv, n_steps=128, batch_size=64, n_epochs=1, seed=0, device="cpu")
    model.learn(TRAIN_STEPS)
    save_sb3(model, folder / f"{env_id}.zip")
    run = write_zoo_files(folder, env_id, [("policy", "MlpPolicy"), ("normalize", True)])
    venv.save(run / "vecnormalize.pkl")
    return ZooRun(folder / f"{env_id}.zip", run / "vecnormalize.pkl", model, venv)


@dataclass(frozen=True)
class SB3Expert:
    """The stand-in for the RL Zoo's CartPole-v1 expert: the same layout, format and shape of policy."""

    zip: Path
    model: Any  # stable_baselines3.PPO, the weights saved

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """What SB3 itself computes: action_net(mlp_extractor.forward_actor(features))."""
        return sb3_head(self.model, obs)


EXPERT_ENV = "CartPole-v1"
# Weights whose float16 logits exceed the fixed table's bound clearly: 1.84x on the 4096 normal
# observations of seed 1 (max |logit| 26), where seeds 0-15 give 0.76x to 1.84x.
EXPERT_SEED = 3
EXPERT_ZIP = f"{EXPERT_ENV}.zip"


def sb3_expert(folder: Path, seed: int = EXPERT_SEED) -> SB3Expert:
    """A PPO MlpPolicy for gym CartPole-v1 (SB3's default: Tanh, pi [64, 64]) with N(0, 1) weights,
    saved in SB3 1.0rc0's format in the RL Zoo layout: `<folder>/CartPole-v1.zip` with
    `CartPole-v1/args.yml` and `config.yml` beside it. Its logits reach tens, as the published
    expert's reach 18, so its float16 outputs exceed the fixed tolerance table where the port
    rule passes (the float16 false alarm)."""
    from stable_baselines3 import PPO

    folder.mkdir(parents=True, exist_ok=True)
    model = PPO("MlpPolicy", EXPERT_ENV, seed=seed, device="cpu")
    saved = save_sb3(model, folder / "sb3-2x.zip", seed)
    expert = to_sb3_1x(saved, folder / EXPERT_ZIP)
    saved.unlink()
    write_zoo_files(folder, EXPERT_ENV)
    return SB3Expert(expert, model)


# The width of `wide_layer`'s hidden layer: summed in float16 (the fp16-accumulate fault), a
# head over 1024 inputs is 6 to 9 times the CPU's float16 error on 64 rows, past the port rule.
WIDE = 1024


def wide_layer(folder: Path) -> Path:
    """A PPO MlpPolicy for CartPole-v1 (Tanh, pi [WIDE]) with N(0, 1) weights, in its RL Zoo
    layout: a float16 accumulator fails its head's 1024-term sums, and that head alone kept in
    float32 mends it."""
    from stable_baselines3 import PPO

    folder.mkdir(parents=True, exist_ok=True)
    model = PPO("MlpPolicy", EXPERT_ENV, seed=0, device="cpu", policy_kwargs={"net_arch": [WIDE]})
    redraw_weights(model)
    model.save(folder / EXPERT_ZIP)
    write_zoo_files(folder, EXPERT_ENV)
    return folder / EXPERT_ZIP


# The first layer's weights of `float16_overflow`, times N(0, 1): its outputs pass float16's
# largest value (65504) on some rows of a normal batch, never float32's.
OVERFLOW_SCALE = 3e4


def float16_overflow(folder: Path, activation: type[nn.Module] = nn.ReLU) -> Path:
    """A PPO MlpPolicy for CartPole-v1 (ReLU, pi [16]) whose first layer's outputs overflow
    float16 on some rows, in its RL Zoo layout: every float16 card, and the CPU in float16, give
    inf and NaN logits there; float32 and the float64 golden stay finite. With `nn.Softsign`
    (inf / inf is NaN in float16) the activation brings the values back into range, so keeping
    the first layer alone in float32 mends it."""
    from stable_baselines3 import PPO

    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"net_arch": [16], "activation_fn": activation}
    model = PPO("MlpPolicy", EXPERT_ENV, seed=0, device="cpu", policy_kwargs=kwargs)
    redraw_weights(model)
    with torch.no_grad():
        model.policy.mlp_extractor.policy_net[0].weight.mul_(OVERFLOW_SCALE)
    model.save(folder / EXPERT_ZIP)
    write_zoo_files(folder, EXPERT_ENV)
    return folder / EXPERT_ZIP


def near_tie_cartpole(folder: Path) -> Path:
    """A PPO MlpPolicy for CartPole-v1 (Tanh, pi [16]) whose two logits are one ULP apart in every
    weight of the head: every deterministic decision is a near-tie that rounding decides, so a card
    that rounds otherwise (`ulp-noise`, one weight one ULP off) plays other episodes from the first
    steps, and its returns are another draw of the same distribution, as in a chaotic environment.
    A few episodes take milliseconds (the pole falls within tens of steps). In its RL Zoo layout."""
    from stable_baselines3 import PPO

    folder.mkdir(parents=True, exist_ok=True)
    model = PPO("MlpPolicy", EXPERT_ENV, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    redraw_weights(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head = model.policy.action_net
        up = torch.randint(0, 2, head.weight[0].shape, generator=gen).bool()
        above, below = (torch.nextafter(head.weight[0], torch.tensor(x)) for x in (np.inf, -np.inf))
        head.weight[1] = torch.where(up, above, below)
        head.bias[1] = head.bias[0]
    model.save(folder / EXPERT_ZIP)
    write_zoo_files(folder, EXPERT_ENV)
    return folder / EXPERT_ZIP


def sb3_head(model: Any, obs: torch.Tensor) -> torch.Tensor:
    """What SB3 itself computes for `obs`: action_net(mlp_extractor.forward_actor(features))."""
    policy = model.policy
    with torch.no_grad():
        features = policy.extract_features(obs, policy.pi_features_extractor)
        return policy.action_net(policy.mlp_extractor.forward_actor(features))


class OnnxableSB3Policy(nn.Module):
    """SB3's documented export wrapper (docs: "Exporting models", ONNX, PPO)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.policy(observation, deterministic=True)


# --- ML-Agents ------------------------------------------------------------------------------------


def mlagents_state_dict(obs_sizes: tuple[int, ...], hidden: int, actions: int, seed: int) -> dict[str, torch.Tensor]:
    """A SimpleActor state dict (two Swish layers) with one normalizer processor per observation
    input, its variance an accumulated sum over 10,000 steps as ML-Agents keeps it."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for i, n in enumerate(obs_sizes):
        state[f"{PROCESSORS}.{i}.normalizer.running_mean"] = torch.randn(n, generator=gen)
        state[f"{PROCESSORS}.{i}.normalizer.running_variance"] = torch.rand(n, generator=gen) * 5e4 + 1e3
        state[f"{PROCESSORS}.{i}.normalizer.normalization_steps"] = torch.tensor(10_000)
    sizes = [sum(obs_sizes), hidden, hidden, actions]
    for name, n_in, n_out in zip([f"{BODY}.0", f"{BODY}.2", f"{HEAD}.mu"], sizes[:-1], sizes[1:], strict=True):
        state[f"{name}.weight"] = torch.randn(n_out, n_in, generator=gen) * n_in**-0.5
        state[f"{name}.bias"] = torch.randn(n_out, generator=gen) * 0.1
    state[f"{HEAD}.log_sigma"] = torch.zeros(1, actions)
    return state


MLAGENTS_EXPORT = "ball.onnx"


def mlagents_export(folder: Path, seed: int = 0) -> Path:
    """The stand-in for ML-Agents 3DBall: 8 observations, 2 continuous actions, 2 x 128 Swish, a
    normalizer; written as an ML-Agents model version 3 export by `export_onnx`, from an ML-Agents
    checkpoint, at opset 9 as ML-Agents writes it. `<folder>/ball.onnx`."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "ball.pt"
    torch.save({"Policy": mlagents_state_dict((8,), hidden=128, actions=2, seed=seed)}, checkpoint)
    out = folder / MLAGENTS_EXPORT
    export_onnx(load_mlagents_pt(checkpoint), out, opset=9)
    checkpoint.unlink()
    return out


def mlagents_layout_export(path: Path, *, branches: tuple[int, ...] = (), memory_size: int = 0, seed: int = 0) -> Path:
    """An ML-Agents model version 3 export of the kinds `mlagents_export` does not write, built
    node by node with ML-Agents' names and layout (its exporter needs mlagents, which pins another
    torch): obs_0 [batch, 6] -> Gemm -> Swish (16 wide), then

    - `memory_size` > 0: `recurrent_in` [batch, 1, memory_size] (ModelSerializer's dummy
      memories), transposed to [1, batch, memory_size] and split into the LSTM's [h | c] halves
      as ML-Agents' `LSTM.forward` does when exporting, one LSTM step, `recurrent_out` = [h | c]
      after it, transposed back; then 2 continuous actions (`mu`, clip(mu, -3, 3) / 3);
    - `branches`: `action_masks` [batch, sum(branches)] (1 allowed), each branch a Gemm whose
      logits are masked as MultiCategoricalDistribution._mask_branch does (logits * mask - 1e8 *
      (1 - mask)), Softmax, ArgMax per branch into `deterministic_discrete_actions` and a
      Multinomial into `discrete_actions`, `discrete_action_output_shape` the branch sizes.
    """
    rng = np.random.default_rng(seed)
    width, hidden = 6, 16
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray | list[float], dtype: type = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> onnx.NodeProto:
        return helper.make_node(op, inputs, [output], name=output, **attrs)

    def gemm(x: str, n_in: int, n_out: int, name: str) -> onnx.NodeProto:
        weight = const(f"{name}.weight", rng.standard_normal((n_out, n_in)) * n_in**-0.5)
        return node("Gemm", [x, weight, const(f"{name}.bias", rng.standard_normal(n_out) * 0.1)], f"{name}/Gemm", transB=1)

    nodes = [
        gemm("obs_0", width, hidden, BODY + ".0"),
        node("Sigmoid", [f"{BODY}.0/Gemm"], "swish/Sigmoid"),
        node("Mul", [f"{BODY}.0/Gemm", "swish/Sigmoid"], "encoding"),
    ]
    inputs = [helper.make_tensor_value_info("obs_0", TensorProto.FLOAT, ["batch", width])]
    outputs = ["version_number", "memory_size"]
    nodes += [node("Identity", [const("version", [3.0])], "version_number")]
    nodes += [node("Identity", [const("memory", [float(memory_size)])], "memory_size")]
    shapes: dict[str, list[int | str]] = {"version_number": [1], "memory_size": [1]}
    x = "encoding"
    if memory_size:
        half = memory_size // 2
        inputs.append(helper.make_tensor_value_info("recurrent_in", TensorProto.FLOAT, ["batch", 1, memory_size]))
        gates = {
            part: const(f"lstm.{part}", rng.standard_normal((1, 4 * half, n)) * 0.3)
            for part, n in (("W", hidden), ("R", half))
        }
        nodes += [
            node("Transpose", ["recurrent_in"], "memories", perm=[1, 0, 2]),  # [1, batch, memory]
            node(
                "Slice",
                ["memories", const("h.start", [0], np.int64), const("h.end", [half], np.int64), const("axis", [2], np.int64)],
                "h0",
            ),
            node(
                "Slice",
                ["memories", const("c.start", [half], np.int64), const("c.end", [memory_size], np.int64), "axis"],
                "c0",
            ),
            node("Unsqueeze", [x, const("seq.axes", [0], np.int64)], "sequence"),
            helper.make_node(
                "LSTM",
                [
                    "sequence",
                    gates["W"],
                    gates["R"],
                    const("lstm.B", rng.standard_normal((1, 8 * half)) * 0.1),
                    "",
                    "h0",
                    "c0",
                ],
                ["lstm/Y", "lstm/Y_h", "lstm/Y_c"],
                name="lstm",
                hidden_size=half,
            ),
            node("Concat", ["lstm/Y_h", "lstm/Y_c"], "memories_out", axis=2),
            node("Transpose", ["memories_out"], "recurrent_out", perm=[1, 0, 2]),
            node("Squeeze", ["lstm/Y", const("y.axes", [0, 1], np.int64)], "lstm_out"),
        ]
        outputs.append("recurrent_out")
        shapes["recurrent_out"] = ["batch", 1, memory_size]
        x, hidden = "lstm_out", half
    if branches:
        inputs.append(helper.make_tensor_value_info("action_masks", TensorProto.FLOAT, ["batch", sum(branches)]))
        sampled, chosen, start = [], [], 0
        for i, size in enumerate(branches):
            b = f"action_model._discrete_distribution.branches.{i}"
            mask = f"{b}/mask"
            nodes += [
                gemm(x, hidden, size, b),
                node(
                    "Slice",
                    [
                        "action_masks",
                        const(f"{b}.start", [start], np.int64),
                        const(f"{b}.end", [start + size], np.int64),
                        const(f"{b}.axis", [1], np.int64),
                    ],
                    mask,
                ),
                node("Mul", [f"{b}/Gemm", mask], f"{b}/Allowed"),
                node("Mul", [mask, const(f"{b}.minus_one", -1.0)], f"{b}/Negated"),
                node("Add", [f"{b}/Negated", const(f"{b}.one", 1.0)], f"{b}/Blocked"),
                node("Mul", [f"{b}/Blocked", const(f"{b}.huge", 1e8)], f"{b}/Penalty"),
                node("Sub", [f"{b}/Allowed", f"{b}/Penalty"], f"{b}/Logits"),
                node("Softmax", [f"{b}/Logits"], f"{b}/Probs", axis=1),
                node("ArgMax", [f"{b}/Probs"], f"{b}/Argmax", axis=1, keepdims=1),
                node("Log", [f"{b}/Probs"], f"{b}/LogProbs"),
                node("Multinomial", [f"{b}/LogProbs"], f"{b}/Sample", sample_size=1, dtype=TensorProto.INT64),
            ]
            chosen.append(f"{b}/Argmax")
            sampled.append(f"{b}/Sample")
            start += size
        nodes += [
            node("Concat", sampled, "discrete_actions", axis=1),
            node("Identity", [const("branch_sizes", [float(n) for n in branches])], "discrete_action_output_shape"),
            node("Concat", chosen, "deterministic_discrete_actions", axis=1),
        ]
        outputs += ["discrete_actions", "discrete_action_output_shape", "deterministic_discrete_actions"]
        shapes |= {
            "discrete_actions": ["batch", len(branches)],
            "discrete_action_output_shape": [len(branches)],
            "deterministic_discrete_actions": ["batch", len(branches)],
        }
    else:
        nodes += [
            gemm(x, hidden, 2, f"{HEAD}.mu"),
            node("Clip", [f"{HEAD}.mu/Gemm", const("clip.min", -3.0), const("clip.max", 3.0)], "clipped"),
            node("Div", ["clipped", const("divisor", [3.0])], "deterministic_continuous_actions"),
        ]
        outputs.append("deterministic_continuous_actions")
        shapes["deterministic_continuous_actions"] = ["batch", 2]
    types = {"discrete_actions": TensorProto.INT64, "deterministic_discrete_actions": TensorProto.INT64}
    graph = helper.make_graph(
        nodes,
        "mlagents",
        inputs,
        [helper.make_tensor_value_info(o, types.get(o, TensorProto.FLOAT), shapes[o]) for o in outputs],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="pytorch")
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


# --- ONNX graphs ----------------------------------------------------------------------------------


def tiny_graph(op: str, path: Path) -> Path:
    """obs [batch, 4] -> Gemm -> `op` -> out [batch, 2], opset 17."""
    weight = numpy_helper.from_array(np.ones((4, 2), np.float32), "weight")
    nodes = [
        helper.make_node("Gemm", ["obs", "weight"], ["gemm"], name="layer"),
        helper.make_node(op, ["gemm"], ["out"], name="odd"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 2])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def save_with_external_data(model: onnx.ModelProto, path: Path, location: str = "weights.bin") -> Path:
    """`model` saved to `path` with every initializer's data in `location`, beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0)
    return path


# --- Hugging Face cache ---------------------------------------------------------------------------

HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(hf_home: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay files out as huggingface_hub does: blobs by hash, a snapshot of symlinks, refs/main."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(HF_COMMIT)
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(content)
        link = repo / "snapshots" / HF_COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


# --- Result rows ----------------------------------------------------------------------------------


def bench_row(**changes: object) -> BenchRow:
    """A bench row as `harness bench` writes it, with `changes`."""
    base = dict(
        policy="cartpole",
        dtype="float32",
        device="sim-cpu0",
        n_cards=1,
        batch_size=8,
        mode="latency",
        first_call_ms=130.0,
        p50_ms=0.9,
        p95_ms=1.1,
        p99_ms=1.3,
        mean_ms=0.95,
        decisions_per_s=8600.0,
        scaling_efficiency=None,
        timing="device",
        detail="",
    )
    return BenchRow(**(base | changes))


def described(label: str, node_id: str = "node0", settings: dict[str, object] | None = None) -> Described:
    """What a simulated card's actor on one thread says of itself, as the driver receives it."""
    device = Device("cpu", 0, "cpu", "test CPU", True, "host", settings=settings or {}, label=label)
    return Described(device, threads=1, policies={}, node_id=node_id)
