"""How far an honest card strays from the port rule's limits: the evidence behind them.

A right card computes differently from the CPU but no worse: another GEMM path (MKL_CBWR=AVX2,
what the `mkl-avx2` fault runs), another thread count (3 or 6, which changes the blocking of
every matmul). Each "card" here is such a path, in a process of its own, computing the same
batches as the CPU reference (1 thread, the default MKL path); both are measured against the
float64 golden and the port rule's error_ratio and max_ratio taken, as a sweep does.

Policies: cartpole, huggy-arch and, from ../shared/cases where present, the RL Zoo's CartPole-v1
(Tanh, logits up to 18) and ML-Agents 3DBall. Batches: normal and uniform, sizes 1, 2, 8, 64 and
4096, six seeds, float32, float16 and bfloat16. The worst ratio in each size class is printed
beside its limit; the ratio reported is the largest worst/limit, which must stay well under 1
(a limit is too tight when an honest path comes near it, too loose when a defect would pass:
TF32 gives 884-2302 on an H200, `reduced-fp32` above 1000 here).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import Comparison
from harness.judge.golden import RatioLimits, compare_to_golden

SIZES = (1, 2, 8, 64, 4096)
SEEDS = range(6)
DISTRIBUTIONS = ("normal", "uniform")
DTYPES = ("float32", "float16", "bfloat16")
CASES = Path(__file__).resolve().parents[2] / "shared" / "cases"
PATHS = {
    "MKL_CBWR=AVX2": {"MKL_CBWR": "AVX2"},
    "3 threads": {"HARNESS_BENCH_THREADS": "3"},
    "6 threads": {"HARNESS_BENCH_THREADS": "6"},
}


def policy_names() -> list[str]:
    names = ["cartpole", "huggy-arch"]
    names += [
        str(p)
        for p in (CASES / "sb3-ppo-CartPole-v1" / "CartPole-v1.zip", CASES / "mlagents-3DBall" / "3DBall.onnx")
        if p.is_file()
    ]
    return names


def outputs(jobs: list[tuple[str, str, str, int, int]]) -> list[dict[str, np.ndarray]]:
    """Each (policy, dtype, distribution, size, seed) computed in this process: the CPU's floating outputs."""
    import torch

    from harness.devices import cpu_reference
    from harness.inference.forward import run_batch
    from harness.policies import cast_policy, load_policy
    from harness.workloads import make_batch

    torch.set_num_threads(int(os.environ.get("HARNESS_BENCH_THREADS", "1")))
    policies = {name: load_policy(name) for name in {job[0] for job in jobs}}
    device, done = cpu_reference(), []
    for name, dtype, distribution, size, seed in jobs:
        batch = make_batch(policies[name].info, distribution, size, seed)
        out = run_batch(cast_policy(policies[name], dtype), device, batch.obs, batch.noise)
        done.append({k: v for k, v in out.items() if v.dtype.kind == "f"})
    return done


def _in_process_with(env: dict[str, str], jobs: list[tuple[str, str, str, int, int]]) -> list[dict[str, np.ndarray]]:
    """`outputs` in a fresh process started with `env` (MKL reads MKL_CBWR once, at load)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(outputs, (jobs,))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key)
            else:
                os.environ[key] = value


def run() -> Comparison:
    limits = RatioLimits()
    jobs = [
        (p, d, dist, size, seed)
        for p in policy_names()
        for d in DTYPES
        for dist in DISTRIBUTIONS
        for size in SIZES
        for seed in SEEDS
    ]
    golden = _in_process_with({}, [(p, "float64", dist, size, seed) for p, _, dist, size, seed in jobs])
    reference = _in_process_with({}, jobs)
    worst: dict[tuple[str, str], tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    for path, env in PATHS.items():
        for job, card, cpu, gold in zip(jobs, _in_process_with(env, jobs), reference, golden, strict=True):
            for name, values in card.items():
                c = compare_to_golden(values, cpu[name], gold[name], job[1], limits)
                klass = (
                    "n >= 1000"
                    if c.n_elements >= limits.LARGE_N
                    else "n >= 100"
                    if c.n_elements >= limits.MEDIUM_N
                    else "n < 100"
                )
                ratio = max(c.error_ratio, c.max_ratio)
                if ratio > worst[job[1], klass][0]:
                    where = f"{Path(job[0]).name} {job[2]}-b{job[3]}-s{job[4]} {name}, {path}"
                    worst[job[1], klass] = (ratio, where)
    limit_of = {"n >= 1000": limits.large, "n >= 100": limits.medium, "n < 100": limits.small}
    measured = {
        f"{dtype:<8} {klass:<9} (limit {limit_of[klass]:g})": f"worst {ratio:.3g} ({where})"
        for (dtype, klass), (ratio, where) in sorted(worst.items())
    }
    return Comparison(
        name=f"honest other code paths against the port rule's limits ({len(jobs)} batches x {len(PATHS)} paths)",
        measured=measured,
        ratio=max(ratio / limit_of[klass] for (_, klass), (ratio, _) in worst.items()),
        ratio_label="largest worst-ratio / limit",
        target=0.5,
        higher_is_better=False,
        notes="an honest path must stay far inside every limit; a defect (reduced-fp32) lands above 100",
    )
