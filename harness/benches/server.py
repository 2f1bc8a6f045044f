"""The server scenario of `harness bench`, after MLPerf LoadGen's Server: requests of one
observation batch each arrive as a Poisson process at a target rate and go through Ray to the
card actors as a deployment sends them (each request ships its batch and calls the card's
`sweep_path`; the card with the fewest requests in flight takes it, which for two cards is what
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
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np

from harness.judge.bench_stats import (
    quantile_interval,
    quantiles,
    quick_look,
    too_few_for_interval,
    too_few_for_percentile,
)
from harness.outputs import Outputs
from harness.benches.latency import Latency, unloaded
from harness.benches.modes import Bench, Mode
from harness.benches.rows import Figures, Measurement, RowKey, Sampled, Summary, sample_columns
from harness.benches.rules import Rule
from harness.benches.windows import Windows
from harness.benches.work import Work
from harness.config.command_plan import BenchPlan
from harness.cluster.place import BenchCard
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


def run_trial(cards: list[BenchCard], w: Work, rate_qps: float, n: int, seed: int, bound_ms: float) -> Trial:
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
        future = cards[card].actor.sweep_path(w.policy, w.dtype, w.batch.obs, w.batch.noise).future()
        future.add_done_callback(partial(finished, i, card))
        futures.append(future)
    all_done.wait()
    for future in futures:
        future.result()  # a card that failed a request fails the bench here, with its error
    scheduled = start + arrivals
    latencies = (answered - scheduled) * 1e3
    p99 = quantiles(latencies, [0.99])[0]
    return Trial(rate_qps, latencies, served, (sent - scheduled) * 1e3, p99, p99 <= bound_ms)


@dataclass(frozen=True)
class ServerSearch:
    """The rate search of one batch on k cards, under `bound_ms`, started from the round trip
    that card 0 measured unloaded (`alone`, its end-to-end latency)."""

    work: Work
    cards: list[BenchCard]
    bound_ms: float
    alone: Latency
    search: Search
    windows: Windows

    @property
    def unreachable(self) -> bool:
        """One request at a time is the lightest load there is: queueing only adds to it."""
        return self.alone.p99_ms > self.bound_ms

    @cached_property
    def shown(self) -> Trial | None:
        """The trial the row's figures come from: at max_qps, else the one that missed the bound at the lowest rate."""
        search = self.search
        return search.best or (min(search.trials, key=lambda t: (t.met, t.rate_qps)) if search.trials else None)

    def summary(self) -> Summary:
        w, shown, best, search = self.work, self.shown, self.search.best, self.search
        p50 = p95 = p99 = mean = None
        interval = None
        if shown is not None:
            p50, p95, p99 = quantiles(shown.latencies_ms, [0.5, 0.95, 0.99])
            mean = float(shown.latencies_ms.mean())
            interval = quantile_interval(shown.latencies_ms, 0.99)
        detail: dict[str, object] = {
            "latency_bound_ms": self.bound_ms,
            "input_sha256": w.batch.sha256,
            "trials": [[round(t.rate_qps, 2), round(t.p99_ms, 4), t.met, len(t.latencies_ms)] for t in search.trials],
            "bracket_qps": [best.rate_qps if best else None, search.missed.rate_qps if search.missed else None],
            "unloaded_end_to_end_p99_ms": self.alone.p99_ms,
            "sent_late_p99_ms": quantiles(shown.late_ms, [0.99])[0] if shown else None,
        }
        figures = Figures(
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            mean_ms=mean,
            decisions_per_s=best.rate_qps * w.batch.size if best else None,
            windows=len(shown.latencies_ms) if shown else None,  # not windows: the requests of the trial shown
            max_qps=best.rate_qps if best else None,
            latency_bound_ms=self.bound_ms,
        )
        key = RowKey(
            f"server/{w.policy}/{w.dtype}/b{w.batch.size}/k{len(self.cards)}",
            w.policy,
            w.dtype,
            w.batch.size,
            "server",
            "end_to_end",
            ",".join(c.label for c in self.cards),
            n_cards=len(self.cards),
        )
        return Summary(key, figures, "p99_ms", interval, detail)

    def samples(self, row_id: str) -> dict[str, np.ndarray]:
        """Every request of every trial; those of the trial the row's figures come from are kept."""
        trials, shown = self.search.trials, self.shown
        n = [len(t.latencies_ms) for t in trials]
        return sample_columns(
            row_id,
            window_index=np.repeat(np.arange(len(trials)), n).tolist(),
            device=[self.cards[c].label for t in trials for c in t.served_by],
            kept=[t is shown for t in trials for _ in t.latencies_ms],
            latency_ms=np.concatenate([t.latencies_ms for t in trials]) if trials else np.array([]),
            offered_qps=[t.rate_qps for t in trials for _ in t.latencies_ms],
            sample=np.concatenate([np.arange(c) for c in n]) if trials else np.array([], dtype=np.int64),
        )

    def sampled(self) -> list[Sampled]:
        return []


def _unreachable(m: ServerSearch) -> str | None:
    if not m.unreachable:
        return None
    return f"the bound is under the unloaded end-to-end p99 ({m.alone.p99_ms:.3g} ms): no rate meets it"


def _none_met(m: ServerSearch) -> str | None:
    search = m.search
    if search.best is not None or not search.trials:
        return None
    lowest = min((t for t in search.trials if not t.met), key=lambda t: t.rate_qps)
    return (
        f"no rate met the bound: p99 {lowest.p99_ms:.3g} ms > {m.bound_ms:g} ms at {lowest.rate_qps:.3g} qps "
        f"({len(lowest.latencies_ms)} requests)"
    )


def _all_met(m: ServerSearch) -> str | None:
    best = m.search.best
    if best is None or m.search.missed is not None:
        return None
    return f"every rate tried met the bound: max_qps is at least {best.rate_qps:.4g}, not the most"


RULES: tuple[Rule[ServerSearch], ...] = (
    Rule("not a quick look", lambda m: quick_look(m.windows.seconds) if m.windows.quick else None),
    Rule("a reachable bound", _unreachable),
    Rule("a rate met the bound", _none_met),
    Rule("a rate missed the bound", _all_met),
    Rule("enough requests for a p99", lambda m: too_few_for_percentile(len(m.shown.latencies_ms), 0.99) if m.shown else None),
    Rule(
        "enough requests for its interval",
        lambda m: too_few_for_interval(len(m.shown.latencies_ms), 0.99) if m.shown else None,
    ),
)


def measure(bench: Bench, earlier: Sequence[Measurement]) -> list[ServerSearch]:
    """A search per batch and card count. It starts where k cards would be busy if each request
    took the unloaded round trip that card 0's end-to-end latency measured."""
    alone = unloaded(earlier, bench.cards[0])
    measured = []
    for w in bench.work:
        for k in bench.steps:
            measured.append(_server(bench.cards[:k], w, alone[w.key], bench.plan, bench.windows))
            bench.bar.update(1)
    return measured


def _server(cards: list[BenchCard], w: Work, alone: Latency, plan: BenchPlan, windows: Windows) -> ServerSearch:
    bound = plan.latency_bound_ms

    def requests(rate: float) -> int:
        if windows.quick:
            return max(1, round(rate * windows.seconds))
        return max(plan.min_queries, math.ceil(rate * max(windows.seconds, TRIAL_BOUNDS * bound / 1e3)))

    searched = ServerSearch(w, cards, bound, alone, Search(None, None, []), windows)
    if searched.unreachable:
        return searched
    search = find_max_rate(
        lambda rate: run_trial(cards, w, rate, requests(rate), plan.common.seed, bound), len(cards) * 1e3 / alone.mean_ms
    )
    return ServerSearch(w, cards, bound, alone, search, windows)


MODE = Mode("server", measure, RULES, lambda b: len(b.work) * len(b.steps))
