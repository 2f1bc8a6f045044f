"""`harness bench`: the rows it writes, its timing loop, its closed loop, and its errors.
Behaviour only: no test asserts how fast anything is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

import harness.inference.timing as timing
from harness.devices import cpu_reference
from harness.envs.cartpole import ENV_ID, HORIZON
from harness.inference.episodes import run_episodes
from harness.inference.timing import MIN_ITERATIONS, WARMUP_ITERATIONS, closed_loop, measure_latency
from harness.policies import CARTPOLE_ZIP, load_policy
from tests.conftest import Head
from tests.helpers import cli


def read_table(results: Path, table: str) -> list[dict]:
    return ds.dataset(results / table, format="parquet", partitioning="hive").to_table().to_pylist()


class FakeClock:
    """perf_counter_ns that moves only when the timed body says so: durations by construction."""

    def __init__(self, durations_ms: list[float]) -> None:
        self.now_ns, self.durations_ms = 0, iter(durations_ms)

    def __call__(self) -> int:
        return self.now_ns

    def body(self) -> None:
        self.now_ns += int(next(self.durations_ms) * 1e6)


def test_first_call_is_timed_alone_and_kept_out_of_the_percentiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # First call 500 ms (a compile), warm-up 2 ms each, then 1, 2, 3, ... ms; a 40 ms budget
    # at the warm-up's 2 ms asks for 20 timed iterations.
    timed = list(np.arange(1, 101, dtype=float))
    clock = FakeClock([500.0] + [2.0] * WARMUP_ITERATIONS + timed)
    monkeypatch.setattr(timing.time, "perf_counter_ns", clock)
    stats = measure_latency(clock.body, lambda: None, budget_s=0.04)
    assert stats.first_call_ms == 500.0
    assert stats.iterations == 20
    assert (stats.p50_ms, stats.p95_ms, stats.p99_ms) == tuple(np.percentile(timed[:20], [50, 95, 99]))
    assert stats.mean_ms == 10.5 and stats.p99_ms < 20


@pytest.mark.parametrize("env_impl", ["numpy", "gymnasium"])
def test_closed_loop_plays_the_same_episodes_as_the_sweep(env_impl: str) -> None:
    """Lockstep episodes, either environment, equal the sweep's episodes at either batching."""
    policy, device = load_policy("cartpole"), cpu_reference()
    result = closed_loop(policy, device, ENV_ID, env_impl, n_envs=3, seed=11, duration_s=0.0)
    assert result.decisions == 3 * HORIZON and result.steps == HORIZON and result.decisions_per_s > 0
    assert result.seeds.tolist() == [11, 12, 13]
    for batching in ("lockstep", "single"):
        for loop, sweep in zip(
            result.first_round, run_episodes(policy, device, ENV_ID, [11, 12, 13], False, batching), strict=True
        ):
            assert loop.episode_seed == sweep.episode_seed and loop.episode_return == sweep.episode_return
            assert loop.actions_sha256 == sweep.actions_sha256, f"seed {loop.episode_seed}, {batching}"
    assert result.returns.tolist() == [e.episode_return for e in result.first_round]


@pytest.mark.slow
def test_bench_writes_sane_rows(ray_head: Head, tmp_path: Path) -> None:
    """The shipped cartpole, and a user's zip that names no environment, given one with --env."""
    sizes = [1, 64]
    model = shutil.copy(CARTPOLE_ZIP, tmp_path / "model.zip")
    done = cli(
        "bench",
        "--policy",
        "cartpole",
        "--policy",
        str(model),
        "--env",
        "seals/CartPole-v0",
        "--accelerator",
        "cpu",
        "--cards",
        "2",
        "--card-counts",
        "1,2",
        "--batch-sizes",
        ",".join(map(str, sizes)),
        "--duration",
        "0.05",
        "--results",
        str(tmp_path),
        "--run-id",
        "t1",
        "--no-progress",
        "--address",
        ray_head.address,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "run t1:" in done.stdout

    rows = read_table(tmp_path, "bench")
    assert {r["run_id"] for r in rows} == {"t1"}
    assert {r["policy"] for r in rows} == {"cartpole", str(model)}
    rows = [r for r in rows if r["policy"] == "cartpole" or r["mode"] == "closed_loop"]
    latency = [r for r in rows if r["mode"] == "latency"]
    # Every (batch, card) has a device row and an end-to-end row.
    assert sorted((r["batch_size"], r["device"], r["timing"]) for r in latency) == sorted(
        (b, d, t) for b in sizes for d in ("sim-cpu0", "sim-cpu1") for t in ("device", "end_to_end")
    )
    for r in latency:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["first_call_ms"] > 0 and r["mean_ms"] > 0
        assert json.loads(r["detail"])["iterations"] >= MIN_ITERATIONS

    throughput = {(r["batch_size"], r["n_cards"]): r for r in rows if r["mode"] == "throughput"}
    assert set(throughput) == {(b, k) for b in sizes for k in (1, 2)}
    for (size, k), r in throughput.items():
        assert r["decisions_per_s"] > 0 and r["first_call_ms"] is None
        assert r["scaling_efficiency"] == pytest.approx(r["decisions_per_s"] / (k * throughput[size, 1]["decisions_per_s"]))
    assert throughput[64, 2]["device"] == "sim-cpu0,sim-cpu1"

    loops = [r for r in rows if r["mode"] == "closed_loop"]
    assert sorted((r["policy"], r["batch_size"]) for r in loops) == sorted(
        (p, b) for p in ("cartpole", str(model)) for b in sizes
    )
    for r in loops:
        detail = json.loads(r["detail"])
        assert r["decisions_per_s"] > 0 and detail["env_impl"] == "auto" and detail["episodes"] % r["batch_size"] == 0
        assert detail["env_id"] == "seals/CartPole-v0" and detail["mean_return"] == 500.0

    (run,) = read_table(tmp_path, "runs")
    assert run["status"] == "bench" and run["n_cards"] == 2 and json.loads(run["config_json"])["card_counts"] == [1, 2]
