"""The Stable-Baselines3 loader against SB3's own policies, 1.x-format saves (one built here, the
real 1.0rc0 one where ../shared/cases is present), and bad files.

Zips are saved by the installed SB3 from freshly built (untrained) models whose weights are
redrawn from N(0, 1), so logits are large and every layer matters. Nothing is trained here.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import pickle
import random
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
import seals  # noqa: F401  (registers seals/CartPole-v0)
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.base_class import BaseAlgorithm

from harness.errors import PolicyLoadError
from harness.policies import load_policy
from harness.policies import loader
from harness.policies.sb3 import archive
from harness.policies.sb3.archive import MAX_MEMBER_BYTES
from harness.policies.sb3_zip import load_sb3_zip
from tests.builders import SB3Expert, edit_data, rewrite_zip, save_sb3, sb3_head, to_sb3_1x
from tests.third_party import ZOO_LOGITS, ZOO_SHA256, ZOO_ZIP


def _obs(size: int, n: int = 64) -> torch.Tensor:
    return torch.randn(n, size, generator=torch.Generator().manual_seed(1)) * 2


def _relu_model() -> PPO:
    kwargs = {"activation_fn": torch.nn.ReLU, "net_arch": {"pi": [32, 16], "vf": [8]}}
    return PPO("MlpPolicy", "CartPole-v1", policy_kwargs=kwargs, seed=0, device="cpu")


@pytest.fixture(scope="module")
def relu_zip(tmp_path_factory: pytest.TempPathFactory) -> tuple[PPO, Path]:
    model = _relu_model()
    return model, save_sb3(model, tmp_path_factory.mktemp("sb3") / "relu.zip")


MODELS: dict[str, Callable[[], BaseAlgorithm]] = {
    "tanh-default": lambda: PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu"),
    "relu-dict": _relu_model,
    "elu-1x-list": lambda: A2C(
        "MlpPolicy",
        "CartPole-v1",
        policy_kwargs={"activation_fn": torch.nn.ELU, "net_arch": [{"pi": [48], "vf": [16]}]},
        seed=0,
        device="cpu",
    ),
    "box-pendulum": lambda: PPO("MlpPolicy", "Pendulum-v1", seed=0, device="cpu"),
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_matches_sb3_actor_critic_policy(kind: str, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SB3 2.x warns about the 1.x list form, which we want
        model = MODELS[kind]()
    path = save_sb3(model, tmp_path / f"{kind}.zip")
    policy = load_sb3_zip(path)
    obs = _obs(policy.info.obs_size)

    with torch.no_grad():
        ours = policy(obs)
    assert ours.shape == (64, policy.info.action_size)
    assert torch.max(torch.abs(ours - sb3_head(model, obs))).item() <= 1e-6
    assert [name for name, _ in policy.named_children()] == ["body", "head"]
    if policy.info.action_kind == "discrete":
        predicted, _ = model.predict(obs.numpy(), deterministic=True)
        assert np.array_equal(policy.deterministic_action(ours).numpy(), predicted)
    else:
        assert policy.log_sigma is not None
        assert torch.equal(policy.log_sigma, model.policy.log_std.detach())
        assert policy.info.inputs[0].low == (-1.0, -1.0, -8.0)


def test_info_names_file_version_activation_and_arch(relu_zip: tuple[PPO, Path]) -> None:
    _, path = relu_zip
    info = load_sb3_zip(path, name="mine").info
    assert (info.name, info.source) == ("mine", "sb3-zip")
    assert info.detail.endswith(", ActorCriticPolicy, ReLU, pi [32, 16]") and info.detail.startswith("SB3 2.")
    assert load_sb3_zip(path).info.name == str(path)


def test_sb3_1x_shared_layers(relu_zip: tuple[PPO, Path], tmp_path: Path) -> None:
    """SB3 1.x net_arch [32, dict(pi=[16])]: the first layer lives in mlp_extractor.shared_net."""
    model, path = relu_zip
    state = torch.load(io.BytesIO(zipfile.ZipFile(path).read("policy.pth")), weights_only=True)
    renamed = {
        key.replace("policy_net.0.", "shared_net.0.").replace("policy_net.2.", "policy_net.0."): value
        for key, value in state.items()
    }
    buffer = io.BytesIO()
    torch.save(renamed, buffer)
    shared = rewrite_zip(path, tmp_path / "shared.zip", **{"policy.pth": buffer.getvalue()})
    shared = edit_data(
        shared, tmp_path / "shared-1x.zip", lambda d: d["policy_kwargs"].update(net_arch=[32, {"pi": [16], "vf": [8]}])
    )

    policy = load_sb3_zip(shared)
    obs = _obs(4)
    with torch.no_grad():
        assert torch.max(torch.abs(policy(obs) - sb3_head(model, obs))).item() <= 1e-6
    assert "shared [32], pi [16]" in policy.info.detail


def test_activation_found_in_pickled_bytes_without_unpickling(relu_zip: tuple[PPO, Path], tmp_path: Path) -> None:
    """With only the `:serialized:` pickle to go on, ReLU is read out of its bytes."""
    model, path = relu_zip
    edited = edit_data(path, tmp_path / "pickled.zip", lambda d: d["policy_kwargs"].pop("activation_fn"))
    policy = load_sb3_zip(edited)
    obs = _obs(4)
    with torch.no_grad():
        assert torch.max(torch.abs(policy(obs) - sb3_head(model, obs))).item() <= 1e-6
    assert ", ReLU," in policy.info.detail


@pytest.mark.parametrize("protocol", [2, 4])
def test_an_activation_is_read_from_either_pickle_protocol_and_only_right_after_its_key(protocol: int) -> None:
    """Protocol <= 3 names a class with GLOBAL, 4 and up with STACK_GLOBAL; both are read. A class
    further on (here, behind a functools.partial) is not taken for the activation."""
    import functools

    def serialized(value: object) -> dict[str, str]:
        return {":serialized:": base64.b64encode(pickle.dumps({"activation_fn": value}, protocol=protocol)).decode()}

    assert archive.activation(Path("x.zip"), serialized(torch.nn.GELU), "Tanh") == "GELU"
    with pytest.raises(PolicyLoadError, match="activation_fn is pickled in a form this loader cannot read"):
        archive.activation(Path("x.zip"), serialized(functools.partial(torch.nn.LeakyReLU, negative_slope=0.2)), "Tanh")


def test_sb3_1x_save_loads_without_gym(sb3_expert: SB3Expert) -> None:
    """A 1.0rc0-format save (gym spaces pickled, 1.x field names, no system_info.txt) reads from
    its JSON alone, where SB3 2.x itself cannot load it (no module named 'gym')."""
    members = zipfile.ZipFile(sb3_expert.zip).namelist()
    assert "system_info.txt" not in members and "_stable_baselines3_version" in members
    data = json.loads(zipfile.ZipFile(sb3_expert.zip).read("data"))
    assert b"gym.spaces.box\x94\x8c\x03Box" in base64.b64decode(data["observation_space"][":serialized:"])
    if importlib.util.find_spec("gym") is None:
        with pytest.raises(ModuleNotFoundError, match="No module named 'gym'"):
            PPO.load(sb3_expert.zip, device="cpu")
    policy = load_sb3_zip(sb3_expert.zip)
    obs = _obs(4, n=4096)
    with torch.no_grad():
        ours = policy(obs)
    assert torch.max(torch.abs(ours - sb3_expert.logits(obs))).item() <= 1e-5
    assert torch.max(torch.abs(ours)).item() > 18, "logits the size of the published expert's, or larger"
    info = policy.info
    assert info.detail == "SB3 1.0rc0, ActorCriticPolicy, Tanh, pi [64, 64]"
    assert (info.action_kind, info.obs_sizes, info.action_size) == ("discrete", (4,), 2)
    high = info.inputs[0].high
    assert high is not None and high[0] == pytest.approx(4.8) and high[1] > 3e38


def test_sb3_1x_rewrite_is_what_the_loader_reads_as_1x(relu_zip: tuple[PPO, Path], tmp_path: Path) -> None:
    """The same weights in either format are the same policy; only the version read differs."""
    _, path = relu_zip
    old = load_sb3_zip(to_sb3_1x(path, tmp_path / "old.zip", version="1.8.0"))
    obs = _obs(4)
    with torch.no_grad():
        assert torch.equal(old(obs), load_sb3_zip(path)(obs))
    assert old.info.detail == "SB3 1.8.0, ActorCriticPolicy, ReLU, pi [32, 16]"


def test_sb3_1_0rc0_case_reproduces_its_logits(cases: Path) -> None:
    path = cases / ZOO_ZIP
    policy = load_sb3_zip(path)
    obs = torch.tensor([row for row, _ in ZOO_LOGITS])
    expected = torch.tensor([logits for _, logits in ZOO_LOGITS])
    with torch.no_grad():
        assert torch.max(torch.abs(policy(obs) - expected)).item() <= 1e-5
    info = policy.info
    assert info.sha256 == ZOO_SHA256
    assert info.detail == "SB3 1.0rc0, ActorCriticPolicy, Tanh, pi [64, 64]"
    assert (info.action_kind, info.obs_sizes, info.action_size) == ("discrete", (4,), 2)
    high = info.inputs[0].high
    assert high is not None and high[0] == pytest.approx(4.8)


class _CreatesFile:
    """A pickle payload: unpickling it calls open(path, "w"), which creates the file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _payload(path: Path) -> str:
    return base64.b64encode(pickle.dumps(_CreatesFile(path))).decode()


def test_pickle_payload_is_never_executed(relu_zip: tuple[PPO, Path], tmp_path: Path) -> None:
    control = tmp_path / "control"
    pickle.loads(base64.b64decode(_payload(control))).close()
    assert control.exists(), "the payload must be live, or this test proves nothing"

    marker = tmp_path / "pwned"
    _, path = relu_zip

    def poison(data: dict[str, Any]) -> None:
        for value in data.values():
            if isinstance(value, dict) and ":serialized:" in value:
                value[":serialized:"] = _payload(marker)

    in_data = edit_data(path, tmp_path / "in-data.zip", poison)
    assert load_sb3_zip(in_data).info.detail.endswith("ReLU, pi [32, 16]")
    buffer = io.BytesIO()
    torch.save({"action_net.weight": _CreatesFile(marker)}, buffer)
    in_weights = rewrite_zip(path, tmp_path / "in-weights.zip", **{"policy.pth": buffer.getvalue()})
    with pytest.raises(PolicyLoadError, match=r"policy\.pth is not a plain torch state dict"):
        load_sb3_zip(in_weights)
    assert not marker.exists()


SOFTMAX = "<class 'torch.nn.modules.activation.Softmax'>"  # a real torch.nn class, but no elementwise activation


def _bad_files(src: Path, tmp: Path) -> dict[str, tuple[Path, str]]:
    """Each bad file and the problem its one-line error must state."""
    text = tmp / "text.zip"
    text.write_text("not a zip")
    padded = json.dumps(json.loads(zipfile.ZipFile(src).read("data"))) + " " * (4 * 1024 * 1024)
    digits = "".join(random.Random(0).choices("0123456789", k=200_000))  # random: it compresses as a real member
    long_int = '{"seed": 1' + digits[1:] + ", " + zipfile.ZipFile(src).read("data").decode().lstrip()[1:]

    def data(name: str, edit: Callable[[dict[str, Any]], None]) -> Path:
        return edit_data(src, tmp / f"{name}.zip", edit)

    kwargs = "policy_kwargs"
    return {
        "missing": (tmp / "nowhere.zip", "no such file"),
        "not-zip": (text, "not a zip file"),
        "no-policy": (rewrite_zip(src, tmp / "no-policy.zip", **{"policy.pth": None}), "zip has no policy.pth"),
        "no-data": (rewrite_zip(src, tmp / "no-data.zip", data=None), "zip has no data"),
        "data-not-json": (rewrite_zip(src, tmp / "bad-json.zip", data=b"{'policy': nope"), "data is not JSON"),
        "fewer-layers": (data("fewer", lambda d: d[kwargs].update(net_arch={"pi": [32]})), "declares 1"),
        "wider-layer": (
            data("wider", lambda d: d[kwargs].update(net_arch={"pi": [32, 20]})),
            r"mlp_extractor.policy_net.2.weight is shape \(16, 32\).*expects \(20, 32\)",
        ),
        "obs-size": (
            data("obs", lambda d: d["observation_space"].update(_shape=[5])),
            r"policy_net.0.weight is shape \(32, 4\).*expects \(32, 5\)",
        ),
        "unknown-torch-activation": (
            data("softmax", lambda d: d[kwargs].update(activation_fn=SOFTMAX)),
            "unknown activation Softmax",
        ),
        "custom-activation": (
            data("custom", lambda d: d[kwargs].update(activation_fn="<class '__main__.MySwish'>")),
            "unknown activation <class '__main__.MySwish'>",
        ),
        "net-arch-only-pickled": (
            data("pickled-arch", lambda d: d[kwargs].pop("net_arch")),
            "net_arch only inside a pickle",
        ),
        "bomb-ratio": (rewrite_zip(src, tmp / "bomb.zip", data=padded.encode()), "looks like a zip bomb"),
        # Python reads an integer of up to 4300 digits, and float() of one past 308 overflows
        "huge-int": (data("huge-int", lambda d: d[kwargs].update(n_lstm_layers=10**400)), "data: an integer of 401 digits"),
        "long-int": (rewrite_zip(src, tmp / "long.zip", data=long_int.encode()), "data: an integer of 200000 digits"),
        "oversized": (
            rewrite_zip(src, tmp / "huge.zip", **{"policy.pth": bytes(MAX_MEMBER_BYTES + 1)}),
            "policy.pth is 67108865 bytes uncompressed, over the",
        ),
    }


def test_bad_files_raise_one_line_errors_naming_the_file(relu_zip: tuple[PPO, Path], tmp_path: Path) -> None:
    for case, (path, problem) in _bad_files(relu_zip[1], tmp_path).items():
        with pytest.raises(PolicyLoadError) as caught:
            load_sb3_zip(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: "), case
        assert "\n" not in message, case
        assert re.search(problem, message), f"{case}: {message}"


def test_cartpole_reaches_500_in_seals_env() -> None:
    policy = load_policy("cartpole")
    assert policy.info.env_id == "seals/CartPole-v0"
    assert ", ReLU, pi [64, 64]" in policy.info.detail
    env = gym.make("seals/CartPole-v0")
    for seed in (0, 1):
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = policy.deterministic_action(policy(torch.as_tensor(obs).unsqueeze(0)))
            obs, reward, terminated, truncated, _ = env.step(int(action.item()))
            total += float(reward)
            done = terminated or truncated
        assert total == 500.0, f"episode seed {seed}: return {total}"


def test_zip_over_the_size_limit_is_refused(relu_zip: tuple[PPO, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The zip is read once, into memory (the bytes hashed are the bytes parsed), so its size is capped."""
    _, path = relu_zip
    limit = path.stat().st_size - 1
    monkeypatch.setattr(archive, "MAX_ZIP_BYTES", limit)
    with pytest.raises(PolicyLoadError, match=re.escape(f"{path}: is over the {limit} byte limit for a policy zip")):
        load_sb3_zip(path)


def _with_empty_members(src: Path, dst: Path, n: int) -> Path:
    """An SB3 zip with `n` empty members added, as a zip of millions of them is built."""
    rewrite_zip(src, dst)
    with zipfile.ZipFile(dst, "a") as zf:
        for i in range(n):
            zf.writestr(f"e{i}", b"")
    return dst


def test_a_zip_of_more_members_than_a_save_has_is_refused_before_they_are_listed(
    relu_zip: tuple[PPO, Path], tmp_path: Path
) -> None:
    _, src = relu_zip
    members = len(zipfile.ZipFile(src).namelist()) + loader.MAX_MEMBERS
    path = _with_empty_members(src, tmp_path / "many.zip", loader.MAX_MEMBERS)
    with pytest.raises(PolicyLoadError) as caught:
        load_sb3_zip(path)
    assert str(caught.value) == f"{path}: zip lists {members} members, over the 1000 limit (a save has fewer than 10)"


def test_a_central_directory_larger_than_its_count_says_is_refused(
    relu_zip: tuple[PPO, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zipfile reads the whole directory whatever count the end record gives: a zip that says 5
    members and lists 300 is refused by its directory's size."""
    _, src = relu_zip
    content = bytearray(_with_empty_members(src, tmp_path / "lying.zip", 300).read_bytes())
    end = content.rindex(b"PK\x05\x06")
    content[end + 8 : end + 12] = struct.pack("<HH", 5, 5)  # members on this disk, members in all
    path = tmp_path / "lying.zip"
    path.write_bytes(bytes(content))
    size = struct.unpack_from("<L", content, end + 12)[0]
    monkeypatch.setattr(loader, "MAX_DIRECTORY_BYTES", 10_000)
    with pytest.raises(PolicyLoadError) as caught:
        load_sb3_zip(path)
    assert str(caught.value) == f"{path}: zip's central directory is {size} bytes, over the 10000 byte limit for 1000 members"


def test_a_number_too_large_for_anything_in_data_is_one_line_from_the_command(tmp_path: Path) -> None:
    from harness.policies import CARTPOLE_ZIP
    from tests.helpers import assert_usage_error, harness

    digits = "".join(random.Random(0).choices("123456789", k=200_000))
    text = zipfile.ZipFile(CARTPOLE_ZIP).read("data").decode().lstrip()
    huge = rewrite_zip(CARTPOLE_ZIP, tmp_path / "huge-int.zip", data=f'{{"seed": {digits}, {text[1:]}'.encode())
    proc = harness("sweep", "--policy", str(huge), "--results", str(tmp_path / "results"), timeout=120)
    assert_usage_error(proc, f"{huge}: data: an integer of 200000 digits, wider than 64 bits")
    assert not (tmp_path / "results" / "runs").exists()
