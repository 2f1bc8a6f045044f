"""`harness bench`: the driver (driver.py), one module per mode (latency, throughput,
closed_loop, server) registered in registry.py, what a mode gives (modes.py: a typed
measurement, a table of rules in rules.py, a row built by rows.py), the windows every
measurement runs (windows.py) and the audit of the timed path (audit.py). Plural because
`harness.bench` is the Python API's function (harness/api.py)."""

from harness.benches.driver import BenchOutcome, bench_cards, run_bench

__all__ = ["BenchOutcome", "bench_cards", "run_bench"]
