"""`harness bench`: the rows it writes, its timing loop, its closed loop, and its errors.
Behaviour only: no test asserts how fast anything is."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

import harness.inference.timing as timing
from harness.devices import cpu_reference
from harness.envs.cartpole import ENV_ID, HORIZON
from harness.inference.episodes import run_episodes
from harness.inference.timing import WARMUP_ITERATIONS, closed_loop, measure_latency
from harness.policies import load_policy
from tests.conftest import Head, QuickBench
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


def test_first_call_is_timed_alone_and_windows_hold_a_duration_and_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # First call 500 ms (a compile), warm-up 2 ms each, then 1, 2, 3, ... ms. A window lasts at
    # least 5 ms and 3 calls: [1, 2, 3] (6 ms), then [4, 5, 6] (4 + 5 is 9 ms but only 2 calls).
    clock = FakeClock([500.0] + [2.0] * WARMUP_ITERATIONS + list(np.arange(1, 101, dtype=float)))
    monkeypatch.setattr(timing.time, "perf_counter_ns", clock)
    run = measure_latency(clock.body, lambda: None, windows=2, window_s=0.005, min_iterations=3)
    assert run.first_call_ms == 500.0
    assert [w.times_ms.tolist() for w in run.windows] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert [w.elapsed_s for w in run.windows] == [0.006, 0.015]
    # Warm already: no first call, no warm-up; and no window holds more than MAX_ITERATIONS calls.
    monkeypatch.setattr(timing, "MAX_ITERATIONS", 4)
    run = measure_latency(clock.body, lambda: None, windows=1, window_s=10.0, min_iterations=1, first_call=False)
    assert run.first_call_ms is None and run.windows[0].times_ms.tolist() == [7.0, 8.0, 9.0, 10.0]


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


def bench(ray_head: Head, results: Path, run_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "bench",
        "--accelerator",
        "cpu",
        "--cards",
        "2",
        "--results",
        str(results),
        "--run-id",
        run_id,
        "--no-progress",
        "--address",
        ray_head.address,
        *args,
    )


@pytest.mark.slow
def test_a_quick_look_writes_every_mode_and_says_it_is_one(quick_bench: QuickBench) -> None:
    """The shipped cartpole, and a user's zip that names no environment, given one with --env
    (the session's quick look, tests/conftest.py)."""
    done, results, model, sizes = quick_bench.proc, quick_bench.results, quick_bench.model, quick_bench.sizes
    assert "run t1:" in done.stdout and "rows are a quick look (--duration 0.05): one window, no interval" in done.stdout

    rows = read_table(results, "bench")
    assert {r["run_id"] for r in rows} == {"t1"}
    assert {r["policy"] for r in rows} == {"cartpole", str(model)}
    for r in rows:  # a quick look is never a result, and says so
        assert not r["valid"] and "quick look (--duration 0.05)" in r["invalid_reason"] and r["ci_low"] is None
    rows = [r for r in rows if r["policy"] == "cartpole" or r["mode"] == "closed_loop"]
    latency = [r for r in rows if r["mode"] == "latency"]
    # Every (batch, card) has a device row and an end-to-end row.
    assert sorted((r["batch_size"], r["device"], r["timing"]) for r in latency) == sorted(
        (b, d, t) for b in sizes for d in ("sim-cpu0", "sim-cpu1") for t in ("device", "end_to_end")
    )
    for r in latency:
        assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"]
        assert r["first_call_ms"] > 0 and r["mean_ms"] > 0 and r["windows"] >= 1
        assert min(json.loads(r["detail"])["iterations"]) >= 10  # the default minimum holds in a quick look too
        assert (r["cpu_share"] is not None) == (r["timing"] == "device")

    throughput = {(r["batch_size"], r["n_cards"]): r for r in rows if r["mode"] == "throughput"}
    assert set(throughput) == {(b, k) for b in sizes for k in (1, 2)}
    for (_, k), r in throughput.items():
        assert r["decisions_per_s"] > 0 and r["first_call_ms"] is None and r["scaling_efficiency"] > 0
        assert len(json.loads(r["detail"])["per_card_cpu_share"]) == k
    assert throughput[64, 2]["device"] == "sim-cpu0,sim-cpu1" and throughput[64, 1]["scaling_efficiency"] == 1.0

    loops = [r for r in rows if r["mode"] == "closed_loop"]
    assert sorted((r["policy"], r["batch_size"]) for r in loops) == sorted(
        (p, b) for p in ("cartpole", str(model)) for b in sizes
    )
    for r in loops:
        detail = json.loads(r["detail"])
        assert r["decisions_per_s"] > 0 and detail["env_impl"] == "auto" and detail["episodes"] % r["batch_size"] == 0
        assert detail["env_id"] == "seals/CartPole-v0" and detail["mean_return"] == 500.0

    server = {(r["batch_size"], r["n_cards"]): r for r in rows if r["mode"] == "server"}
    assert set(server) == {(b, k) for b in sizes for k in (1, 2)}
    for r in server.values():
        assert r["latency_bound_ms"] == 20.0 and r["timing"] == "end_to_end"
        # Searched, or (a loaded machine's round trip already over the bound) not, and the row says so.
        unloaded = json.loads(r["detail"])["unloaded_end_to_end_p99_ms"]
        assert json.loads(r["detail"])["trials"] or (unloaded > 20.0 and "no rate meets it" in r["invalid_reason"]), r

    audit = read_table(results, "checks")
    assert audit and all(c["kind"] == "bench_audit" and c["passed"] and c["gating"] for c in audit)
    assert {c["device_a"] for c in audit} == {"sim-cpu0", "sim-cpu1"}
    assert "audit: " in done.stdout and "equal the sweep's run_batch bit for bit" in done.stdout

    (run,) = read_table(results, "runs")
    assert run["status"] == "bench" and run["n_cards"] == 2 and json.loads(run["config_json"])["card_counts"] == [1, 2]


# What docs/bench.md documents: every row's figures and interval from bench_samples, in SQL.
# p50: the median of the kept windows' p50s (a server row keeps one trial); p99 pools every kept call.
PERCENTILES_SQL = """
WITH w AS (SELECT run_id, row_id, window_index, quantile_cont(latency_ms, 0.5) AS p50
           FROM bench_samples WHERE kept GROUP BY ALL),
     m AS (SELECT run_id, row_id, median(p50) AS p50 FROM w GROUP BY ALL),
     s AS (SELECT run_id, row_id, quantile_cont(latency_ms, 0.99) AS p99 FROM bench_samples WHERE kept GROUP BY ALL)
SELECT b.row_id, b.p50_ms, b.p99_ms, m.p50, s.p99
FROM bench b JOIN m USING (run_id, row_id) JOIN s USING (run_id, row_id)
WHERE b.mode IN ('latency', 'server')
"""
LATENCY_CI_SQL = """
WITH w AS (SELECT run_id, row_id, window_index, quantile_cont(latency_ms, 0.5) AS p50
           FROM bench_samples WHERE kept GROUP BY ALL),
     sorted AS (SELECT run_id, row_id, list_sort(list(p50)) AS p50s FROM w GROUP BY ALL)
SELECT b.row_id, b.ci_low, b.ci_high,
       p50s[(b.detail->>'$.ci_ranks[0]')::INT] AS low, p50s[(b.detail->>'$.ci_ranks[1]')::INT] AS high
FROM bench b JOIN sorted USING (run_id, row_id) WHERE b.mode = 'latency'
"""
SERVER_CI_SQL = """
WITH sorted AS (SELECT run_id, row_id, list_sort(list(latency_ms)) AS calls FROM bench_samples WHERE kept GROUP BY ALL)
SELECT b.row_id, b.ci_low, b.ci_high,
       calls[(b.detail->>'$.ci_ranks[0]')::INT] AS low, calls[(b.detail->>'$.ci_ranks[1]')::INT] AS high
FROM bench b JOIN sorted USING (run_id, row_id) WHERE b.mode = 'server' AND b.ci_low IS NOT NULL
"""
THROUGHPUT_SQL = """
WITH t AS (SELECT run_id, row_id, window_index, sum(decisions_per_s) AS dps FROM bench_samples WHERE kept GROUP BY ALL),
     r AS (SELECT * FROM bench WHERE mode = 'throughput')
SELECT k.row_id, any_value(k.decisions_per_s) AS dps, any_value(k.scaling_efficiency) AS efficiency,
       median(tk.dps) AS sql_dps, median(tk.dps / (k.n_cards * t1.dps)) AS sql_efficiency
FROM r k JOIN r one ON one.run_id = k.run_id AND one.policy = k.policy AND one.dtype = k.dtype
                    AND one.batch_size = k.batch_size AND one.n_cards = 1
JOIN t tk ON tk.run_id = k.run_id AND tk.row_id = k.row_id
JOIN t t1 ON t1.run_id = k.run_id AND t1.row_id = one.row_id AND t1.window_index = tk.window_index
GROUP BY k.row_id
"""


def query(results: Path, sql: str) -> list[dict]:
    done = cli("query", sql, "--results", str(results), "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_windowed_rows_carry_intervals_that_bench_samples_reproduce_in_sql(ray_head: Head, tmp_path: Path) -> None:
    """Six short windows (the fewest with a 95% interval) and server trials of 368 requests: every
    figure and interval comes back from bench_samples through `harness query`."""
    done = bench(
        ray_head,
        tmp_path,
        "w1",
        *("--policy", "cartpole", "--batch-sizes", "8", "--windows", "6", "--window", "0.02", "--min-iterations", "5"),
        *("--min-queries", "368", "--latency-bound-ms", "50"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_table(tmp_path, "bench")
    assert {r["mode"] for r in rows} == {"latency", "throughput", "closed_loop", "server"}
    for r in rows:
        assert r["valid"] == (r["invalid_reason"] == ""), r
        headline = r[r["ci_of"]]
        if headline is None:
            # The one row without a figure: a server batch whose unloaded round trip is already over
            # the bound (a loaded machine's) is not searched, and says so.
            assert r["mode"] == "server" and r["ci_low"] is None and r["ci_high"] is None, r
            assert not r["valid"] and "no rate meets it" in r["invalid_reason"] and json.loads(r["detail"])["trials"] == []
        else:  # the machine's load can make a row invalid, never a figure outside its interval
            assert r["ci_low"] <= headline <= r["ci_high"], r
    percentiles = query(tmp_path, PERCENTILES_SQL)
    for r in percentiles:
        assert (r["p50_ms"], r["p99_ms"]) == (pytest.approx(r["p50"], rel=1e-12), pytest.approx(r["p99"], rel=1e-12)), r
    searched = sum(r["mode"] == "server" and r["p99_ms"] is not None for r in rows)
    assert len(percentiles) == 4 + searched  # 4 latency rows, and the server rows that ran a trial
    for r in query(tmp_path, LATENCY_CI_SQL) + query(tmp_path, SERVER_CI_SQL):
        assert (r["ci_low"], r["ci_high"]) == (pytest.approx(r["low"], rel=1e-12), pytest.approx(r["high"], rel=1e-12)), r
    throughput = query(tmp_path, THROUGHPUT_SQL)
    assert len(throughput) == 2
    for r in throughput:
        assert r["dps"] == pytest.approx(r["sql_dps"], rel=1e-9) and r["efficiency"] == pytest.approx(r["sql_efficiency"])
    for r in (r for r in rows if r["mode"] == "server"):
        # Whether any rate meets the bound is the machine's to say (a loaded one may meet none): a
        # row either has its rate and that rate's figures, or is invalid and says why.
        if r["max_qps"] is None:
            assert not r["valid"] and "no rate" in r["invalid_reason"], r
        else:
            assert r["p99_ms"] <= 50.0 and r["decisions_per_s"] == r["max_qps"] * 8 and r["windows"] >= 368, r


@pytest.mark.slow
def test_a_fault_in_the_timed_path_fails_the_audit(ray_head: Head, tmp_path: Path) -> None:
    """Card 1's timed path rounds its float32 matmul inputs as TF32 does (a fast path that turned
    on reduced precision): its outputs are no longer what the sweep validated, and the bench
    says so (exit 1), while card 0 passes."""
    done = bench(
        ray_head,
        tmp_path,
        "f1",
        *("--policy", "cartpole", "--batch-sizes", "8", "--duration", "0.02", "--inject-fault", "card1:reduced-fp32"),
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "FAIL audit:" in done.stdout and "audit FAILED" in done.stdout
    checks = read_table(tmp_path, "checks")
    failed = [c for c in checks if not c["passed"]]
    assert failed and {c["device_a"] for c in failed} == {"sim-cpu1"} and all(c["kind"] == "bench_audit" for c in failed)
    assert all(c["passed"] for c in checks if c["device_a"] == "sim-cpu0")
    assert "ulp" in failed[0]["detail"] and {c["unit_id"].split("/")[0] for c in failed} == {"latency", "throughput"}
    (run,) = read_table(tmp_path, "runs")
    assert run["faults"] == "card1:reduced-fp32"
    assert "timed path only" in json.loads(run["devices"])[1]["faults"][0]
