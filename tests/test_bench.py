"""`harness bench`: the rows it writes, its timing loop, its closed loop, and its errors.
Behaviour only: no test asserts how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

import actors.bench_actor as bench_actor
from actors.bench_actor import WARMUP_ITERATIONS, closed_loop, measure_latency
from harness.devices import cpu_reference
from harness.inference import run_episode
from harness.policies import load_policy
from harness.vec_cartpole import ENV_ID, HORIZON

HARNESS = Path(sys.executable).parent / "harness"


def run_harness(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HARNESS), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


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
    monkeypatch.setattr(bench_actor.time, "perf_counter_ns", clock)
    stats = measure_latency(clock.body, lambda: None, budget_s=0.04)
    assert stats.first_call_ms == 500.0
    assert stats.iterations == 20
    assert (stats.p50_ms, stats.p95_ms, stats.p99_ms) == tuple(np.percentile(timed[:20], [50, 95, 99]))
    assert stats.mean_ms == 10.5 and stats.p99_ms < 20


@pytest.mark.parametrize("env_kind", ["vector", "seals"])
def test_closed_loop_plays_the_same_episodes_as_the_sweep(env_kind: str) -> None:
    """Lockstep episodes, either environment, equal the sweep's one-at-a-time episodes."""
    policy, device = load_policy("cartpole"), cpu_reference()
    result = closed_loop(policy, device, env_kind, n_envs=3, seed=11, duration_s=0.0)
    assert result.decisions == 3 * HORIZON and result.decisions_per_s > 0
    assert result.seeds.tolist() == [11, 12, 13]
    for i, seed in enumerate(result.seeds.tolist()):
        episode = run_episode(policy, device, ENV_ID, seed, stochastic=False)
        assert result.returns[i] == episode.episode_return
        assert np.array_equal(result.first_actions[i], episode.actions)


@pytest.mark.slow
def test_bench_writes_sane_rows(tmp_path: Path) -> None:
    sizes = [1, 64]
    done = run_harness(
        "bench", "--policy", "cartpole", "--accelerator", "cpu", "--cards", "1,2", "--batch-sizes", ",".join(map(str, sizes)),
        "--duration", "0.05", "--results", str(tmp_path), "--run-id", "t1", "--no-progress", cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "run t1:" in done.stdout

    rows = read_table(tmp_path, "bench")
    assert {r["run_id"] for r in rows} == {"t1"}
    latency = [r for r in rows if r["mode"] == "latency"]
    # Every (batch, card) has a device row and an end-to-end row.
    assert sorted((r["batch_size"], r["device"], r["timing"]) for r in latency) == sorted(
        (b, d, t) for b in sizes for d in ("sim-cpu0", "sim-cpu1") for t in ("device", "end_to_end")
    )
    for r in latency:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["first_call_ms"] > 0 and r["mean_ms"] > 0
        assert json.loads(r["detail"])["iterations"] >= bench_actor.MIN_ITERATIONS

    throughput = {(r["batch_size"], r["n_cards"]): r for r in rows if r["mode"] == "throughput"}
    assert set(throughput) == {(b, k) for b in sizes for k in (1, 2)}
    for (size, k), r in throughput.items():
        assert r["decisions_per_s"] > 0 and r["first_call_ms"] is None
        assert r["scaling_efficiency"] == pytest.approx(r["decisions_per_s"] / (k * throughput[size, 1]["decisions_per_s"]))
    assert throughput[64, 2]["device"] == "sim-cpu0,sim-cpu1"

    loops = [r for r in rows if r["mode"] == "closed_loop"]
    assert sorted(r["batch_size"] for r in loops) == sizes
    for r in loops:
        detail = json.loads(r["detail"])
        assert r["decisions_per_s"] > 0 and detail["env"] == "vector" and detail["episodes"] % r["batch_size"] == 0

    (run,) = read_table(tmp_path, "runs")
    assert run["status"] == "bench" and run["n_cards"] == 2 and json.loads(run["config_json"])["cards"] == [1, 2]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--env", "gym"], "--env"),
        (["--cards", "two"], "comma-separated list of int"),
        (["--duration", "-1"], "--duration"),
        (["--policy", "cartpol"], "did you mean 'cartpole'"),
    ],
)
def test_bad_option_is_exit_2_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_harness("bench", "--accelerator", "cpu", "--results", str(tmp_path), *args, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("harness: error:") and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "bench").exists()
