"""The default sweep's phases side by side with the least a Ray run can do: a bare `ray.init` (a
private local cluster, as the sweep starts it) and three actors that only import torch (two on
simulated cards, one on a CPU, with the same runtime environment as the sweep's actors).

Rounds alternate the two sides, so load that comes and goes falls on both; each figure is the
median over the rounds. What the sweep's start-up adds to the bare one is its own: the placement
group, the actors' imports of the harness, loading the policies, opening the cards and reading
their precision settings back. The sweep cannot start faster than the bare side (it does the bare
side's work and more), so a ratio under 1 is reported as suspect. Target: the sweep's start-up
(Ray and its actors) within 1.5 times the bare one's.
"""

from __future__ import annotations

import contextlib
import io
import logging
import statistics
import tempfile
import time
from pathlib import Path

import ray

from benchmarks import Comparison

# The harness is imported inside the functions, not here: Ray imports this module in the bare
# side's actors to find TorchOnly, and they must import torch and nothing of the harness.
ROUNDS = 3
TARGET = 1.5
CARDS = 2


class TorchOnly:
    """An actor that imports torch, as every card actor does first, and nothing else."""

    def __init__(self) -> None:
        import torch  # noqa: F401

    def ready(self) -> bool:
        return True


def bare() -> dict[str, float]:
    """Seconds of a bare ray.init, its actors up, and its shutdown."""
    from harness.devices import SIMULATED, accelerator
    from harness.cluster.place import BASE_ENV

    for logger in accelerator(SIMULATED).quiet_loggers:  # as the sweep's ray.init: no AscendCL traceback
        logging.getLogger(logger).setLevel(logging.CRITICAL)
    seconds = {}
    start = time.perf_counter()
    ray.init(
        address="local",
        resources={"NPU": float(CARDS)},
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    seconds["ray"] = time.perf_counter() - start
    start = time.perf_counter()
    env = {"runtime_env": {"env_vars": dict(BASE_ENV)}}
    actors = [ray.remote(TorchOnly).options(num_cpus=0, resources={"NPU": 1}, **env).remote() for _ in range(CARDS)]
    actors.append(ray.remote(TorchOnly).options(num_cpus=1, **env).remote())
    ray.get([a.ready.remote() for a in actors])
    seconds["actors"] = time.perf_counter() - start
    start = time.perf_counter()
    ray.shutdown()
    seconds["shutdown"] = time.perf_counter() - start
    return seconds


def sweep() -> dict[str, float]:
    """The default sweep's phases (its printed lines kept out of the benchmark's)."""
    from harness.cluster.phases import Phases
    from harness.config.command_plan import sweep_plan
    from harness.config.options import SweepConfig
    from harness.sweeps.driver import run_sweep
    from harness.sweeps.resolve import resolve

    with tempfile.TemporaryDirectory() as results, contextlib.redirect_stdout(io.StringIO()):
        start = time.perf_counter()
        phases = Phases()
        outcome = run_sweep(resolve(sweep_plan(SweepConfig(results=Path(results), progress=False)), phases), phases=phases)
        total = time.perf_counter() - start
    return {**outcome.phases.seconds, "total": total}


def run() -> Comparison:
    rounds: list[tuple[dict[str, float], dict[str, float]]] = [(bare(), sweep()) for _ in range(ROUNDS)]

    def median(side: int, phase: str) -> float:
        return statistics.median(r[side].get(phase, 0.0) for r in rounds)

    measured = {}
    for phase, label in (("ray", "Ray start-up"), ("actors", "actors up"), ("shutdown", "Ray shutdown")):
        measured[label] = f"bare {median(0, phase):5.1f} s   sweep {median(1, phase):5.1f} s"
    for phase in ("plan", "fanout", "compute", "judge", "write"):
        measured[f"sweep: {phase}"] = f"{median(1, phase):.2f} s"
    measured["sweep: total"] = f"{median(1, 'total'):.1f} s"
    bare_startup = statistics.median(r[0]["ray"] + r[0]["actors"] for r in rounds)
    sweep_startup = statistics.median(r[1]["ray"] + r[1]["actors"] for r in rounds)
    return Comparison(
        name=f"start-up: the default sweep against a bare ray.init and actors that only import torch ({ROUNDS} rounds)",
        measured=measured,
        ratio=sweep_startup / bare_startup,
        ratio_label="sweep start-up / bare start-up (Ray and actors)",
        target=TARGET,
        higher_is_better=False,
        limit=1.0,
    )
