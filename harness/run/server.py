"""The server scenario of `harness bench`, after MLPerf LoadGen's Server: requests of one
observation batch each arrive as a Poisson process at a target rate and go through Ray to the
card actors as a deployment sends them (each request ships its batch and calls the card's
`run_batch`; the card with the fewest requests in flight takes it, which for two cards is what
Ray Serve's power-of-two-choices router does). For each batch size and card count, the highest
rate whose p99 latency stays under `--latency-bound-ms` is found by search.

A request's latency runs from its scheduled arrival to its outputs back in the driver, so a
driver that falls behind its schedule adds to the latency instead of quietly offering a lower
rate (LoadGen's rule against coordinated omission).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

import numpy as np
from tqdm import tqdm

from harness.judge.bench_stats import (
    quantile_interval,
    quantiles,
    quick_look,
    too_few_for_interval,
    too_few_for_percentile,
)
from harness.outputs import Outputs
from harness.run.measure import Measured, Measurement, Windows, judged_row, sample_columns
from harness.run.options import BenchConfig
from harness.run.place import BenchCard
from harness.store.schema import BenchRow
from harness.workloads import poisson_arrivals

# The search: it brackets the bound by doubling up or halving down from its first rate, then
# bisects the bracket in log-rate until its ends are within RESOLUTION of each other. Every trial
# has the full size (`--min-queries` requests, and TRIAL_BOUNDS bounds long): probes of 100
# requests were seen to meet the bound at rates that no full trial then met, which left a row
# without a rate however its search ended.
RESOLUTION = 0.1
MAX_TRIALS = 10
# The first rate keeps the cards busy all the time; at a quarter of it they are busy a quarter of
# the time and queueing adds little to a request's latency: a bound missed there is out of reach
# (an eighth cost the default bench 28 s a trial, 400 requests at 14 qps, to learn nothing more).
MAX_HALVINGS = 2
# A trial lasts at least this many latency bounds: a rate the cards cannot sustain builds a queue
# that grows with the trial's length, not its count, and at 1 + RESOLUTION times what they sustain
# it reaches one bound only after 1 / RESOLUTION bounds. Shorter trials pass overloaded rates.
TRIAL_BOUNDS = round(1 / RESOLUTION)
# A trial's first request is scheduled this long after its schedule is made.
START_DELAY_S = 0.05


@dataclass(frozen=True)
class Trial:
    """Requests at one arrival rate, every one answered."""

    rate_qps: float
    latencies_ms: np.ndarray  # float64 (requests,): scheduled arrival to outputs back in the driver
    served_by: np.ndarray  # int64 (requests,): which card served each request
    late_ms: np.ndarray  # float64 (requests,): how long after its arrival the driver sent each request
    p99_ms: float
    met: bool  # p99 under the bound


@dataclass(frozen=True)
class Search:
    best: Trial | None  # the highest rate whose trial met the bound
    missed: Trial | None  # the lowest rate tried that did not
    trials: list[Trial]


def find_max_rate(
    trial: Callable[[float], Trial],
    start_qps: float,
    resolution: float = RESOLUTION,
    max_trials: int = MAX_TRIALS,
    max_halvings: int = MAX_HALVINGS,
) -> Search:
    """The highest rate at which a trial meets its bound, to within `resolution` where
    `max_trials` allow: double from `start_qps` until a miss, or halve until a hit (at most
    `max_halvings` times), then bisect between the highest hit and the lowest miss."""
    trials: list[Trial] = []
    hit: Trial | None = None
    missed: Trial | None = None

    def tried(rate: float) -> None:
        nonlocal hit, missed
        trials.append(run := trial(rate))
        if run.met:
            hit = run
        else:
            missed = run

    tried(start_qps)
    halvings = 0
    while len(trials) < max_trials and (hit is None) != (missed is None):
        if hit is not None:
            tried(hit.rate_qps * 2)
        elif missed is not None and halvings < max_halvings:
            tried(missed.rate_qps / 2)
            halvings += 1
        else:
            break
    while hit is not None and missed is not None and missed.rate_qps > hit.rate_qps * (1 + resolution):
        if len(trials) >= max_trials:
            break
        tried(math.sqrt(hit.rate_qps * missed.rate_qps))
    return Search(hit, missed, trials)


def run_trial(cards: list[BenchCard], w: Measured, rate_qps: float, n: int, seed: int, bound_ms: float) -> Trial:
    """`n` requests arriving at `rate_qps` (a Poisson process), each sent to the card with the
    fewest in flight; back once every one is answered."""
    arrivals = poisson_arrivals(rate_qps, n, seed)
    in_flight = [0] * len(cards)
    lock, all_done = threading.Lock(), threading.Event()
    remaining = [n]
    answered = np.full(n, np.nan)
    sent = np.empty(n)
    served = np.empty(n, dtype=np.int64)

    def finished(i: int, card: int, _: Future[Outputs]) -> None:
        answered[i] = time.perf_counter()
        with lock:
            in_flight[card] -= 1
            remaining[0] -= 1
            if remaining[0] == 0:
                all_done.set()

    futures = []
    start = time.perf_counter() + START_DELAY_S
    for i, at in enumerate(arrivals):
        wait = start + at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        with lock:
            card = min(range(len(cards)), key=in_flight.__getitem__)
            in_flight[card] += 1
        sent[i], served[i] = time.perf_counter(), card
        future = cards[card].actor.run_batch(w.policy, w.dtype, w.batch.obs, w.batch.noise).future()
        future.add_done_callback(partial(finished, i, card))
        futures.append(future)
    all_done.wait()
    for future in futures:
        future.result()  # a card that failed a request fails the bench here, with its error
    scheduled = start + arrivals
    latencies = (answered - scheduled) * 1e3
    p99 = quantiles(latencies, [0.99])[0]
    return Trial(rate_qps, latencies, served, (sent - scheduled) * 1e3, p99, p99 <= bound_ms)


def measure_server(
    cards: list[BenchCard],
    steps: list[int],
    work: list[Measured],
    measured: list[Measurement],
    config: BenchConfig,
    windows: Windows,
    bar: tqdm,
) -> list[Measurement]:
    """A `server` row per batch and card count. The search starts where k cards would be busy
    if each request took the unloaded round trip that card 0's end-to-end latency row measured."""
    unloaded = {
        (m.row.policy, m.row.dtype, m.row.batch_size): m.row
        for m in measured
        if m.row.mode == "latency" and m.row.timing == "end_to_end" and m.row.device == cards[0].label
    }
    rows = []
    for w in work:
        alone = unloaded[w.policy, w.dtype, w.batch.size]
        for k in steps:
            rows.append(_server(cards[:k], w, alone, config, windows))
            bar.update(1)
    return rows


def _server(cards: list[BenchCard], w: Measured, alone: BenchRow, config: BenchConfig, windows: Windows) -> Measurement:
    bound = config.latency_bound_ms
    assert alone.p99_ms is not None and alone.mean_ms is not None  # a latency row always has them
    row_id = f"server/{w.policy}/{w.dtype}/b{w.batch.size}/k{len(cards)}"

    def requests(rate: float) -> int:
        if windows.quick:
            return max(1, round(rate * windows.seconds))
        return max(config.min_queries, math.ceil(rate * max(windows.seconds, TRIAL_BOUNDS * bound / 1e3)))

    reasons: list[str | None]
    if alone.p99_ms > bound:
        # One request at a time is the lightest load there is: queueing only adds to it.
        search = Search(None, None, [])
        reasons = [f"the bound is under the unloaded end-to-end p99 ({alone.p99_ms:.3g} ms): no rate meets it"]
    else:
        search = find_max_rate(
            lambda rate: run_trial(cards, w, rate, requests(rate), config.seed, bound),
            len(cards) * 1e3 / alone.mean_ms,
        )
        reasons = _search_reasons(search, bound)
    reasons.insert(0, quick_look(windows.seconds) if windows.quick else None)
    shown = search.best or (min(search.trials, key=lambda t: (t.met, t.rate_qps)) if search.trials else None)
    p50 = p95 = p99 = mean = None
    interval = None
    if shown is not None:
        p50, p95, p99 = quantiles(shown.latencies_ms, [0.5, 0.95, 0.99])
        mean = float(shown.latencies_ms.mean())
        interval = quantile_interval(shown.latencies_ms, 0.99)
        n = len(shown.latencies_ms)
        reasons += [
            too_few_for_percentile(n, 0.99),
            too_few_for_interval(n, 0.99),
        ]
    best = search.best
    detail = {
        "latency_bound_ms": bound,
        "input_sha256": w.batch.sha256,
        "trials": [[round(t.rate_qps, 2), round(t.p99_ms, 4), t.met, len(t.latencies_ms)] for t in search.trials],
        "bracket_qps": [best.rate_qps if best else None, search.missed.rate_qps if search.missed else None],
        "unloaded_end_to_end_p99_ms": alone.p99_ms,
        "sent_late_p99_ms": quantiles(shown.late_ms, [0.99])[0] if shown else None,
    }
    row = judged_row(
        row_id=row_id,
        policy=w.policy,
        dtype=w.dtype,
        batch_size=w.batch.size,
        mode="server",
        timing="end_to_end",
        device=",".join(c.label for c in cards),
        n_cards=len(cards),
        reasons=reasons,
        ci_of="p99_ms",
        interval=interval,
        detail=detail,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=mean,
        decisions_per_s=best.rate_qps * w.batch.size if best else None,
        windows=len(shown.latencies_ms) if shown else None,
        max_qps=best.rate_qps if best else None,
        latency_bound_ms=bound,
    )
    return Measurement(row, _samples(row_id, cards, search.trials, shown))


def _search_reasons(search: Search, bound: float) -> list[str | None]:
    if search.best is None:
        lowest = min((t for t in search.trials if not t.met), key=lambda t: t.rate_qps)
        return [
            f"no rate met the bound: p99 {lowest.p99_ms:.3g} ms > {bound:g} ms at {lowest.rate_qps:.3g} qps "
            f"({len(lowest.latencies_ms)} requests)"
        ]
    if search.missed is None:
        return [f"every rate tried met the bound: max_qps is at least {search.best.rate_qps:.4g}, not the most"]
    return []


def _samples(row_id: str, cards: list[BenchCard], trials: list[Trial], shown: Trial | None) -> dict[str, np.ndarray]:
    """Every request of every trial; those of the trial the row's figures come from are kept."""
    n = [len(t.latencies_ms) for t in trials]
    return sample_columns(
        row_id,
        window_index=np.repeat(np.arange(len(trials)), n).tolist(),
        device=[cards[c].label for t in trials for c in t.served_by],
        kept=[t is shown for t in trials for _ in t.latencies_ms],
        latency_ms=np.concatenate([t.latencies_ms for t in trials]) if trials else np.array([]),
        offered_qps=[t.rate_qps for t in trials for _ in t.latencies_ms],
        sample=np.concatenate([np.arange(c) for c in n]) if trials else np.array([], dtype=np.int64),
    )
