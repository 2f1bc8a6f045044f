"""Two policies a user brings that the harness once could not sweep, end to end through the real
command on the session's Ray cluster (two simulated cards and the CPU): a RecurrentPPO policy at
`--batch-sizes 1,8` (a batch of one row once ended in a traceback), and a MaskablePPO policy on
sb3-contrib's InvalidActionEnvDiscrete (Discrete observations, once refused), which plays its
episodes in the environment the harness registers for it, with its masks. Both sweep to their
verdicts, exit 0, read back from Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete

from harness.envs.spec import INVALID_ACTIONS_ID
from tests.builders import save_sb3
from tests.conftest import Head
from tests.helpers import read_table, sweep_on
from tests.test_sb3_families import ON

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swept(ray_head: Head, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("integer-observations-sweep")
    recurrent = save_sb3(
        RecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs={"lstm_hidden_size": 8, "net_arch": [8]}, **ON),
        folder / "recurrent.zip",
    )
    env = InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60)
    masked = save_sb3(MaskablePPO("MlpPolicy", env, policy_kwargs={"net_arch": [8]}, **ON), folder / "masked.zip")
    config = folder / "sweep.toml"
    policies = json.dumps([str(recurrent), str(masked)])
    config.write_text(f'policies = {policies}\n[envs]\n"{recurrent}" = "CartPole-v1"\n"{masked}" = "{INVALID_ACTIONS_ID}"\n')
    results = folder / "results"
    proc = sweep_on(ray_head.address, results, "--config", str(config), "--episodes", "2", "--dtypes", "float32",
                    "--batch-sizes", "1,8", "--cards", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return recurrent, masked, results


def _checks(results: Path, policy: Path) -> list[dict[str, Any]]:
    return [r for r in read_table(results, "checks").to_pylist() if r["policy"] == str(policy)]


def test_a_recurrent_policy_sweeps_at_batch_sizes_1_and_8(swept: tuple[Path, Path, Path]) -> None:
    recurrent, _, results = swept
    checks = _checks(results, recurrent)
    normal = {c["workload"] for c in checks if c["workload"].startswith("normal-")}
    assert {w.split("-")[1] for w in normal} >= {"b1", "b8"}
    at_one = [c for c in checks if c["workload"].startswith("normal-b1-") and c["kind"] == "cpu_reference"]
    assert {c["output"] for c in at_one} >= {"logits", "state_h", "state_c"} and all(c["passed"] for c in at_one)
    assert all(c["passed"] for c in checks if c["gating"])


def test_a_masked_policy_of_discrete_observations_plays_its_environment(swept: tuple[Path, Path, Path]) -> None:
    _, masked, results = swept
    checks = _checks(results, masked)
    kinds = {c["kind"] for c in checks}
    assert {"cross_card", "cpu_reference", "masked_actions"} <= kinds and all(c["passed"] for c in checks if c["gating"])
    episodes = [e for e in read_table(results, "episodes").to_pylist() if e["policy"] == str(masked)]
    assert {e["env_id"] for e in episodes} == {INVALID_ACTIONS_ID}
    assert {e["device"] for e in episodes} >= {"sim-cpu0", "sim-cpu1", "cpu"}
    assert {e["length"] for e in episodes} == {100}  # the environment's ep_length
    # The environment is made from each episode's seed: every card plays the CPU's episodes.
    played = {(e["device"], e["mode"], e["batching"], e["episode_seed"]): e["actions_sha256"] for e in episodes}
    card0 = {key[1:]: sha for key, sha in played.items() if key[0] == "sim-cpu0"}
    assert card0 and card0 == {key[1:]: sha for key, sha in played.items() if key[0] == "cpu"}
    masked_episodes = [c for c in checks if c["kind"] == "masked_actions" and "episode" in (c["workload"] or "")]
    assert masked_episodes and all(c["passed"] for c in masked_episodes)
    [run] = read_table(results, "runs").to_pylist()
    recorded = {p["name"]: p for p in json.loads(run["policies"])}
    assert recorded[str(masked)]["inputs"] == [{"name": "obs", "shape": [1], "dtype": "int64", "one_hot_classes": [80]}]
