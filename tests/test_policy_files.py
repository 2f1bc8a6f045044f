"""The files beside a policy: the RL Zoo's run files (on the real rl-trained-agents case) and a
Hugging Face SB3 repository's model card and vec_normalize.pkl, in a folder and in the cache."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import seals  # noqa: F401  (registers seals/CartPole-v0)
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from harness.errors import PolicyLoadError
from harness.policies import CARTPOLE_ZIP, PolicySpec, load_policy, with_found_env
from harness.policies import policy_files
from harness.policies.policy_files import find_env, model_card_env, read_run_file
from tests.builders import CARTPOLE_PPO, SB3Expert, cache_repo, redraw_weights
from tests.third_party import ZOO_CONFIG, ZOO_LOGITS, ZOO_SHA256, ZOO_ZIP

HF_ENV = "seals/CartPole-v0"
HF_ZIP = "ppo-seals-CartPole-v0.zip"
# A model card as huggingface_sb3 (and rl_zoo3's push_to_hub) writes it.
CARD = """---
library_name: stable-baselines3
tags:
- {tag}
- deep-reinforcement-learning
- reinforcement-learning
- stable-baselines3
model-index:
- name: PPO
  results:
  - task:
      type: reinforcement-learning
      name: reinforcement-learning
    dataset:
      name: {dataset}
      type: {dataset}
    metrics:
    - type: mean_reward
      value: 500.00 +/- 0.00
      name: mean_reward
      verified: false
---

# **PPO** Agent playing **{dataset}**
This is a trained model of a **PPO** agent playing **{dataset}**.
"""


@pytest.fixture(scope="module")
def case_zip(sb3_expert: SB3Expert) -> bytes:
    """An SB3 zip's bytes, to lay out beside other files."""
    return sb3_expert.zip.read_bytes()


def test_rl_zoo_folder_names_its_environment_and_keeps_its_logits(sb3_expert: SB3Expert) -> None:
    policy = load_policy(str(sb3_expert.zip))
    info = policy.info
    assert (info.env_id, info.env_source) == ("CartPole-v1", "RL Zoo CartPole-v1/args.yml")
    assert (info.obs_normalization, policy.normalizer) == ("", None)
    assert info.sha256 == hashlib.sha256(sb3_expert.zip.read_bytes()).hexdigest()
    obs = torch.tensor([row for row, _ in ZOO_LOGITS])
    with torch.no_grad():
        assert torch.max(torch.abs(policy(obs) - sb3_expert.logits(obs))).item() <= 1e-5


def test_rl_zoo_case_names_its_environment_and_keeps_its_logits(cases: Path) -> None:
    policy = load_policy(str(cases / ZOO_ZIP))
    info = policy.info
    assert (info.env_id, info.env_source) == ("CartPole-v1", "RL Zoo CartPole-v1/args.yml")
    assert (info.sha256, info.obs_normalization, policy.normalizer) == (ZOO_SHA256, "", None)
    obs = torch.tensor([row for row, _ in ZOO_LOGITS])
    with torch.no_grad():
        assert torch.max(torch.abs(policy(obs) - torch.tensor([logits for _, logits in ZOO_LOGITS]))).item() <= 1e-5


@pytest.fixture(params=["built", "third-party"])
def zoo_config(request: pytest.FixtureRequest, sb3_expert: SB3Expert) -> Path:
    """A config.yml as the RL Zoo writes it: ours, and the rl-trained-agents one where present."""
    if request.param == "third-party":
        return request.getfixturevalue("cases") / ZOO_CONFIG
    return sb3_expert.zip.parent / "CartPole-v1" / "config.yml"


def test_rl_zoo_run_files_read_as_plain_dicts(zoo_config: Path) -> None:
    assert zoo_config.read_text().startswith("!!python/object/apply:collections.OrderedDict\n")
    config = read_run_file(zoo_config)
    assert type(config) is dict and list(config) == [key for key, _ in CARTPOLE_PPO]
    assert (config["policy"], config["n_envs"], config["learning_rate"]) == ("MlpPolicy", 8, "lin_0.001")


def test_run_file_loader_runs_no_other_tag(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    args = tmp_path / "args.yml"
    for tag in ("!!python/object/apply:os.system", "!!python/object/new:os.system", "!!python/name:os.system"):
        args.write_text(f"{tag} [touch {marker}]\n")
        with pytest.raises(PolicyLoadError, match=re.escape(f"{args}: is not readable YAML (could not determine")):
            read_run_file(args)
    assert not marker.exists()


@dataclass(frozen=True)
class HubRepo:
    """A Hugging Face SB3 repository's files in a folder, and the SB3 objects that wrote them."""

    folder: Path
    model: PPO
    venv: VecNormalize

    @property
    def zip(self) -> Path:
        return self.folder / HF_ZIP


@pytest.fixture(scope="module")
def hub_repo(tmp_path_factory: pytest.TempPathFactory) -> HubRepo:
    venv = VecNormalize(DummyVecEnv([lambda: gym.make(HF_ENV)]))
    venv.reset()
    rng = np.random.default_rng(0)
    for _ in range(200):  # statistics of real observations; the policy itself needs no training
        venv.step(rng.integers(0, 2, size=1))
    model = PPO("MlpPolicy", venv, seed=0, device="cpu")
    redraw_weights(model)
    folder = tmp_path_factory.mktemp("hub")
    model.save(folder / HF_ZIP)
    venv.save(folder / "vec_normalize.pkl")
    (folder / "README.md").write_text(CARD.format(tag=HF_ENV, dataset=HF_ENV))
    return HubRepo(folder, model, venv)


def test_hub_folder_names_its_environment_and_normalizes_as_sb3(hub_repo: HubRepo) -> None:
    policy = load_policy(str(hub_repo.zip))
    info = policy.info
    assert (info.env_id, info.env_source) == (HF_ENV, "model card README.md")
    assert info.obs_normalization == "VecNormalize from vec_normalize.pkl: clip 10, epsilon 1e-08"
    obs = np.random.default_rng(1).normal(size=(256, 4)).astype(np.float32) * 5
    normalized = hub_repo.venv.normalize_obs(obs)
    with torch.no_grad():
        ours = policy(torch.from_numpy(obs))
    predicted, _ = hub_repo.model.predict(normalized, deterministic=True)
    assert np.array_equal(policy.deterministic_action(ours).numpy(), predicted)


LOAD_FROM_CACHE = """
import json, sys
from harness.policies import load_policy
policy = load_policy(sys.argv[1])
info = policy.info
print(json.dumps([info.env_id, info.env_source, info.obs_normalization, type(policy.normalizer).__name__]))
"""


def test_hf_uri_reads_the_card_and_statistics_in_the_cache(hub_repo: HubRepo, tmp_path: Path) -> None:
    """The cache's snapshot is symlinks into blobs: the files beside are found by the link's path."""
    files = {name: (hub_repo.folder / name).read_bytes() for name in (HF_ZIP, "README.md", "vec_normalize.pkl")}
    cache_repo(tmp_path, "sb3/ppo-seals-CartPole-v0", files)
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    uri = "hf://sb3/ppo-seals-CartPole-v0"
    done = subprocess.run([sys.executable, "-c", LOAD_FROM_CACHE, uri], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = [HF_ENV, "model card README.md", "VecNormalize from vec_normalize.pkl: clip 10, epsilon 1e-08"]
    assert json.loads(done.stdout) == [*expected, "VecNormalizeObs"]


def write_card(folder: Path, text: str) -> Path:
    card = folder / "README.md"
    card.write_text(text)
    return card


def test_model_card_prefers_model_index_then_an_environment_tag(tmp_path: Path) -> None:
    assert model_card_env(write_card(tmp_path, CARD.format(tag="CartPole-v1", dataset=HF_ENV))) == HF_ENV
    tags_only = "---\ntags:\n- reinforcement-learning\n- ALE/Pong-v5\n- stable-baselines3\n---\n# Pong\n"
    assert model_card_env(write_card(tmp_path, tags_only)) == "ALE/Pong-v5"
    no_env = "---\nlicense: mit\ntags: [deep-reinforcement-learning, stable-baselines3]\n---\n"
    assert model_card_env(write_card(tmp_path, no_env)) is None
    assert model_card_env(write_card(tmp_path, "# A README without front matter\n")) is None
    # A model card is read from its start only: prose past the limit is no error.
    long_card = CARD.format(tag=HF_ENV, dataset=HF_ENV) + "é" * policy_files.MAX_CARD_BYTES
    assert model_card_env(write_card(tmp_path, long_card)) == HF_ENV


def test_no_files_beside_means_no_environment(tmp_path: Path, case_zip: bytes) -> None:
    policy = tmp_path / "mine.zip"
    policy.write_bytes(case_zip)
    assert find_env(policy) is None
    write_card(tmp_path, "# my policy\n")
    info = load_policy(str(policy)).info
    assert (info.env_id, info.env_source, info.obs_normalization) == (None, "", "")


ORDERED = "!!python/object/apply:collections.OrderedDict\n"
MALFORMED: dict[str, tuple[str, bytes, str]] = {
    "args-not-yaml": ("CartPole-v1/args.yml", b"env: [CartPole-v1\n", "is not readable YAML"),
    "args-a-list": ("CartPole-v1/args.yml", b"- env\n- CartPole-v1\n", "is YAML but not a mapping (list)"),
    "args-no-env": ("CartPole-v1/args.yml", (ORDERED + "- - - algo\n    - ppo\n").encode(), "env is missing, expected"),
    "args-env-spaces": ("CartPole-v1/args.yml", b"env: Cart Pole\n", "env is 'Cart Pole', expected an environment id"),
    "args-bad-pairs": ("CartPole-v1/args.yml", (ORDERED + "- [env, CartPole-v1]\n").encode(), "OrderedDict pairs"),
    "args-not-utf8": ("CartPole-v1/args.yml", b"env: Cart\xffPole\n", "is not UTF-8 text"),
    "card-not-yaml": ("README.md", b"---\ntags: [CartPole-v1\n---\n# card\n", "is not readable YAML (expected ','"),
    "card-a-list": ("README.md", b"---\n- CartPole-v1\n---\n", "front matter is YAML but not a mapping"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_beside_raise_one_line_errors(case: str, tmp_path: Path, case_zip: bytes) -> None:
    name, content, problem = MALFORMED[case]
    (tmp_path / "CartPole-v1.zip").write_bytes(case_zip)
    bad = tmp_path / name
    bad.parent.mkdir(exist_ok=True)
    bad.write_bytes(content)
    with pytest.raises(PolicyLoadError) as caught:
        load_policy(str(tmp_path / "CartPole-v1.zip"))
    message = str(caught.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message, message
    assert problem in message, message


def test_oversized_run_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = tmp_path / "args.yml"
    args.write_text("env: CartPole-v1\n" + "# padding\n" * 10)
    monkeypatch.setattr(policy_files, "MAX_YAML_BYTES", 32)
    with pytest.raises(PolicyLoadError, match=re.escape(f"{args}: is over the 32 byte limit for a run file")):
        read_run_file(args)


def test_front_matter_past_the_yaml_limit_is_refused_unparsed(tmp_path: Path) -> None:
    """A megabyte of tags took a second and a half to parse, in the driver and again in every
    actor; front matter is refused past 64 KiB, by its size where it ends in the first MiB read."""
    tags = "".join(f"- tag-{i}\n" for i in range(20_000))
    card = write_card(tmp_path, f"---\ntags:\n{tags}- {HF_ENV}\n---\n# A card\n")
    size = len(f"tags:\n{tags}- {HF_ENV}".encode())
    assert size > policy_files.MAX_YAML_BYTES
    with pytest.raises(PolicyLoadError) as caught:
        model_card_env(card)
    assert str(caught.value) == f"{card}: front matter is {size} bytes, over the 65536 byte limit"
    card = write_card(tmp_path, "---\ntags:\n" + "- tag\n" * 200_000 + "---\n")
    with pytest.raises(PolicyLoadError) as caught:
        model_card_env(card)
    assert str(caught.value) == f"{card}: front matter does not end in the first 1048576 bytes: over the 65536 byte limit"


@pytest.mark.timeout(60)
def test_front_matter_is_found_in_linear_time(tmp_path: Path) -> None:
    """huggingface_hub's pattern takes time that grows with the square of a run of newlines."""
    assert model_card_env(write_card(tmp_path, "---\n" + "\n" * 1_000_000)) is None
    card = "---\r\n\r\ntags:\n- CartPole-v1\n\n\n---\n" + "\n" * 1_000_000
    assert model_card_env(write_card(tmp_path, card)) == "CartPole-v1"


def test_a_spec_carrying_the_found_environment_reads_no_file_for_it(tmp_path: Path) -> None:
    """What each actor loads from: the driver's environment travels in the spec, and the card is
    not parsed again (here it could not be); the zip's bytes are still read and hashed."""
    policy = tmp_path / "mine.zip"
    policy.write_bytes(CARTPOLE_ZIP.read_bytes())
    write_card(tmp_path, CARD.format(tag=HF_ENV, dataset=HF_ENV))
    found = load_policy(str(policy))
    spec = with_found_env(PolicySpec(str(policy)), found)
    write_card(tmp_path, "---\ntags: [unclosed\n---\n")
    again = load_policy(spec)
    assert (again.info.env_id, again.info.env_source, again.info.sha256) == (HF_ENV, "model card README.md", found.info.sha256)
    with pytest.raises(PolicyLoadError, match="is not readable YAML"):
        load_policy(str(policy))
