"""The files the tests read, built here: test modules import them from this one module, never
from each other.

Each builder writes what a real tool writes, with the tool where it is installed: SB3 saves by the
installed Stable-Baselines3; RL Zoo run folders as `rl_zoo3 train` leaves them; ML-Agents
checkpoints as ML-Agents keeps them; ONNX graphs node by node; a Hugging Face cache as
huggingface_hub lays it out; result rows as the harness writes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections import OrderedDict
from collections.abc import Callable
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

from harness.policies.mlagents import BODY, HEAD, PROCESSORS
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


# --- RL Zoo run folders ---------------------------------------------------------------------------


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
    run = folder / env_id
    run.mkdir(parents=True)
    save_sb3(model, folder / f"{env_id}.zip")
    venv.save(run / "vecnormalize.pkl")
    # As the RL Zoo writes it: yaml.dump of an OrderedDict, tagged python/object/apply.
    (run / "args.yml").write_text(yaml.dump(OrderedDict([("algo", "ppo"), ("env", env_id), ("seed", 0)])))
    return ZooRun(folder / f"{env_id}.zip", run / "vecnormalize.pkl", model, venv)


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
