"""`python -m benchmarks [NAME]...`: run the benchmarks one after another (each starts and stops
its own Ray, so two clusters never share the machine) and print what each measured."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = (
    "sweep_wall_time",
    "startup",
    "warm",
    "ratio_limits",
    "closed_loop_rule",
    "episode_batching",
    "closed_loop_vs_sb3",
    "closed_loop_env",
    "ray_vs_in_process",
    "card_scaling",
    "reference_pool",
    "timer_overhead",
    "cli_speed",
)


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    results = []
    for name in names or BENCHMARKS:
        comparison = importlib.import_module(f"benchmarks.{name}").run()
        print(comparison.render(), flush=True)
        results.append(comparison)
    print(f"targets met: {sum(c.met for c in results)}/{len(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
