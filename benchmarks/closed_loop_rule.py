"""The closed-loop rule against evidence: does it ever fail an honest card, and does it catch
cards that lose return? (docs/verdicts.md, "Closed-loop returns".)

Policies: SB3 PPO trained briefly here on chaotic environments (LunarLander, its continuous
version, BipedalWalker, Pendulum, Acrobot), cached under `.cache/closed_loop_rule/` (never
committed; delete the folder to train again). Short trainings are enough: the question is not
how good a policy is but whether a one-ULP difference parts its trajectories.

Cards, simulated in this process by the harness's own faults (harness/inference/faults.py) on the
policy the CPU reference plays: two honest ones, `ulp-noise` (every layer's outputs nudged by up
to one ULP, as another card's kernels round) and `perturb-weight` (one weight one ULP off); and
cards that truly lose return: `action-bias` at several sizes, `noisy-sampler` (stochastic episodes
only), and a float16 card with a float16 accumulator (`fp16-accumulate`) next to an honest float16
card. Every card plays the same seeds as the CPU float32 (`episodes` per mode, deterministic and
stochastic); each block of 5, 10, 24 and 100 consecutive seeds is one verdict of `judge_returns`,
as a sweep of that many episodes would give.

Also the rule alone on drawn returns (normal, bimodal as a lander's, rare disasters, heavy tails,
and a lander's where the honest card replays the CPU's episode in half the seeds), where the truth
is known, in one table: at 5, 10, 20 and 100 episodes, how often an honest card (two draws of one
distribution per seed) FAILs, with the rule and with its 95% interval alone (without the loss
beyond doubt at FAIL_LEVEL), how often it PASSes, and how often a card that loses 0.5, 1, 2 and 10
standard deviations FAILs. `python -m benchmarks.closed_loop_rule [--quick]` prints that table
alone (5000 verdicts a cell: 320 s here beside other work; --quick 1000, 21 s).

The ratio: the rate of FAIL over every honest card's verdict (target: 0).
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import Comparison
from harness.judge.returns import Outcome, ReturnComparison, outcome, t_interval
from harness.judge.verdicts import ClosedLoopRules, Paired, judge_returns

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "closed_loop_rule"
# Environment -> how it is made (gymnasium id and keyword arguments) and the PPO training steps.
ENVS: dict[str, tuple[str, dict[str, Any], int]] = {
    "LunarLander-v3": ("LunarLander-v3", {}, 20_000),
    "LunarLanderContinuous-v3": ("LunarLander-v3", {"continuous": True}, 20_000),
    "BipedalWalker-v3": ("BipedalWalker-v3", {}, 20_000),
    "Pendulum-v1": ("Pendulum-v1", {}, 20_000),
    "Acrobot-v1": ("Acrobot-v1", {}, 20_000),
}
EPISODES = 100
BLOCKS = (5, 10, 24, 100)
HONEST = ("all:ulp-noise", "all:perturb-weight")
LOSSES = (
    "all:action-bias=0.05",
    "all:action-bias=0.2",
    "all:action-bias=0.5",
    "all:noisy-sampler=0.5",
    "all:noisy-sampler=2",
)
FLOAT16 = ("float16", "float16 + all:fp16-accumulate")
TARGET_FAIL_RATE = 0.005
# The drawn-returns table: episodes per verdict, losses in standard deviations, verdicts per cell.
DRAWN_EPISODES = (5, 10, 20, 100)
DRAWN_LOSSES = (0.5, 1.0, 2.0, 10.0)
DRAWN_KINDS = ("normal", "bimodal", "rare disasters", "heavy tails", "bimodal, half replayed")
TRIALS = 5000
WORKERS = 2


def train(job: tuple[str, str, dict[str, Any], int, Path]) -> str:
    """The cached PPO for an environment, trained here once: (env, its gymnasium id, keyword
    arguments, steps, the cache folder)."""
    import harness  # noqa: F401  (the device-backend guard, in this worker too)
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO

    env, make_id, kwargs, steps, cache = job
    path = cache / f"ppo-{env}-{steps}.zip"
    if path.exists():
        return str(path)
    torch.set_num_threads(1)
    model = PPO("MlpPolicy", gym.make(make_id, **kwargs), seed=0, device="cpu", n_steps=1024, batch_size=256, n_epochs=5)
    model.learn(steps)
    cache.mkdir(parents=True, exist_ok=True)
    model.save(path)
    return str(path)


@dataclass(frozen=True)
class Played:
    """One card's episodes of one mode: returns, and where each parts from the CPU's (None for the CPU)."""

    returns: np.ndarray
    actions: list[bytes]


def play(job: tuple[str, str, str, bool, int]) -> tuple[tuple[str, str, bool], Played, float]:
    """The episodes of seeds 0 .. n - 1 of one policy (env, path), card and mode, in this process."""
    import harness  # noqa: F401
    import torch

    from harness.devices import cpu_reference
    from harness.inference.episodes import run_episodes
    from harness.inference.fault_specs import parse_faults
    from harness.inference.faults import HONEST_SEED, add_ulp_noise, inject
    from harness.policies import PolicySpec, cast_policy, load_policy

    env, path, card, stochastic, n = job
    torch.set_num_threads(1)
    policy = load_policy(PolicySpec(source=path, env_id=env, env_source="--env"))
    # "cpu": the CPU float32 reference; "honest": its replay under the honest-card model, as a
    # sweep's reference replays it; a fault spec; "float16" and "float16 + SPEC": a float16 card.
    dtype, _, spec = card.partition(" + ") if card.startswith("float16") else ("float32", "", card)
    copy = cast_policy(policy, dtype)
    if card == "honest":
        add_ulp_noise(copy, HONEST_SEED)
    elif ":" in spec:
        inject(copy, parse_faults([spec]))
    start = time.perf_counter()
    episodes = run_episodes(copy, cpu_reference(), env, list(range(n)), stochastic, "lockstep")
    played = Played(np.asarray([e.episode_return for e in episodes]), [e.actions.tobytes() for e in episodes])
    return (env, card, stochastic), played, time.perf_counter() - start


def parted(card: Played, cpu: Played) -> list[int | None]:
    return [None if a == b else 0 for a, b in zip(card.actions, cpu.actions, strict=True)]


def verdicts(card: Played, cpu: Played, honest: Played, blocks: tuple[int, ...]) -> dict[int, list[ReturnComparison]]:
    """One verdict per block of consecutive seeds, for each block size."""
    found: dict[int, list[ReturnComparison]] = {}
    steps, honest_steps = parted(card, cpu), parted(honest, cpu)
    for size in blocks:
        found[size] = []
        for start in range(0, len(card.returns) - size + 1, size):
            block = slice(start, start + size)
            pair = Paired(
                np.arange(start, start + size), card.returns[block], cpu.returns[block], steps[block], honest_steps[block]
            )
            result = judge_returns("card", pair, ClosedLoopRules()).result
            assert isinstance(result, ReturnComparison)
            found[size].append(result)
    return found


def rates(results: list[ReturnComparison]) -> str:
    counts = Counter(r.outcome for r in results)
    n = len(results)
    return " ".join(f"{o.name} {counts[o.value] / n:5.1%}" for o in Outcome) + f" (of {n})"


def drawn(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == "normal":
        return rng.normal(100, 30, n)
    if kind == "heavy tails":
        return 100 + 30 * rng.standard_t(3, n)
    crash = rng.random(n) < (0.08 if kind == "rare disasters" else 0.3)
    if kind == "rare disasters":
        return np.where(crash, rng.normal(-300, 20, n), rng.normal(250, 20, n))
    return np.where(crash, rng.normal(-100, 20, n), rng.normal(220, 30, n))


def drawn_outcome(card: np.ndarray, cpu: np.ndarray) -> tuple[Outcome, bool]:
    """The rule's outcome, as `judge_returns` reaches it past the exact answers (the margin half
    the pooled spread), and whether the 95% interval alone lies below the margin."""
    margin = ClosedLoopRules().margin.of(float(np.std(np.concatenate([card, cpu]), ddof=1)))
    difference = t_interval(card - cpu)
    return outcome(difference, margin, card.size), difference.high < -margin


def synthetic(trials: int = TRIALS) -> tuple[dict[str, str], float]:
    """The table of the rule on drawn returns whose truth is known, and its worst honest FAIL rate."""
    rng = np.random.default_rng(0)
    header = "honest: FAIL (95% alone) PASS | FAIL at a loss of " + " ".join(f"{k:g} std" for k in DRAWN_LOSSES)
    measured = {f"drawn returns, {trials} verdicts a cell": header}
    worst = 0.0
    for kind in DRAWN_KINDS:
        sigma = float(np.std(drawn(kind, rng, 1_000_000)))
        for n in DRAWN_EPISODES:
            honest, alone, fails = Counter[Outcome](), 0, Counter[float]()
            for _ in range(trials):
                cpu, card = drawn(kind, rng, n), drawn(kind, rng, n)
                if kind.endswith("half replayed"):  # the honest card's trajectory never parts in these seeds
                    card = np.where(rng.random(n) < 0.5, cpu, card)
                verdict, below = drawn_outcome(card, cpu)
                honest[verdict] += 1
                alone += below
                for k in DRAWN_LOSSES:
                    fails[k] += drawn_outcome(card - k * sigma, cpu)[0] is Outcome.FAIL
            worst = max(worst, honest[Outcome.FAIL] / trials)
            losses = " ".join(f"{fails[k] / trials:7.1%}" for k in DRAWN_LOSSES)
            measured[f"drawn {kind:<22} n={n:<3}"] = (
                f"{honest[Outcome.FAIL] / trials:6.2%} ({alone / trials:5.2%}) {honest[Outcome.PASS] / trials:5.1%} | {losses}"
            )
    return measured, worst


def run(
    envs: dict[str, tuple[str, dict[str, Any], int]] = ENVS,
    episodes: int = EPISODES,
    blocks: tuple[int, ...] = BLOCKS,
    cache: Path = CACHE,
    trials: int = TRIALS,
) -> Comparison:
    start = time.perf_counter()
    measured: dict[str, str] = {}
    context = multiprocessing.get_context("spawn")
    with context.Pool(WORKERS) as pool:
        trained = pool.map(train, [(env, *how, cache) for env, how in envs.items()])
        paths = dict(zip(envs, trained, strict=True))
        cards = ["cpu", "honest", *HONEST, *LOSSES, *FLOAT16]
        jobs = [
            (env, paths[env], card, stochastic, episodes)
            for env in envs
            for card in cards
            for stochastic in (False, True)
            if not (card.startswith("all:noisy-sampler") and not stochastic)
        ]
        played: dict[tuple[str, str, bool], Played] = {}
        seconds: dict[str, float] = defaultdict(float)
        for key, mine, took in pool.imap_unordered(play, jobs):
            played[key] = mine
            seconds[key[0]] += took
    measured["policies"] = ", ".join(f"PPO {env} ({envs[env][2] / 1000:g}k steps)" for env in envs)
    measured["episodes played"] = (
        f"{episodes} per mode and card, {len(jobs)} runs in {time.perf_counter() - start:.0f} s "
        f"({', '.join(f'{env} {s:.0f} s' for env, s in seconds.items())})"
    )
    by_card: dict[tuple[str, int], list[ReturnComparison]] = defaultdict(list)
    effect: dict[str, list[float]] = defaultdict(list)
    parted_share: dict[str, list[float]] = defaultdict(list)
    for (env, card, stochastic), mine in played.items():
        if card in ("cpu", "honest"):
            continue
        cpu, honest = played[env, "cpu", stochastic], played[env, "honest", stochastic]
        for size, results in verdicts(mine, cpu, honest, blocks).items():
            by_card[card, size] += results
        spread = float(np.std(np.concatenate([mine.returns, cpu.returns]), ddof=1)) or 1.0
        effect[card].append(float(np.mean(mine.returns - cpu.returns)) / spread)
        parted_share[card].append(float(np.mean([s is not None for s in parted(mine, cpu)])))
    for card in (*HONEST, *LOSSES, *FLOAT16):
        for size in blocks:
            measured[f"{card:<32} {size:>3} episodes"] = (
                f"{rates(by_card[card, size])}; mean return change {np.mean(effect[card]):+.2f} std, "
                f"{np.mean(parted_share[card]):.0%} of episodes part from the CPU's"
            )
    honest_replay = [
        np.mean([s is not None for s in parted(played[e, "honest", m], played[e, "cpu", m])])
        for e in envs
        for m in (False, True)
    ]
    measured["the CPU's honest-port replay"] = f"{np.mean(honest_replay):.0%} of episodes part from the CPU's"
    table, _ = synthetic(trials)
    measured |= table
    judged = [r for card in HONEST for size in blocks for r in by_card[card, size]]
    fail_rate = sum(r.outcome == Outcome.FAIL for r in judged) / len(judged)
    return Comparison(
        name=f"the closed-loop rule: honest cards and cards that lose return ({len(envs)} trained policies, {episodes} "
        "episodes per mode)",
        measured=measured,
        ratio=fail_rate,
        ratio_label="FAIL rate of honest cards (ulp-noise, perturb-weight)",
        target=TARGET_FAIL_RATE,
        higher_is_better=False,
        notes="INCONCLUSIVE never passes and does not gate; more episodes (--episodes auto) decide it",
    )


def main(argv: list[str]) -> int:
    """The drawn-returns table alone: no policies, no episodes."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.closed_loop_rule", description=main.__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{TRIALS // 5} verdicts a cell instead of {TRIALS}")
    trials = TRIALS // 5 if parser.parse_args(argv).quick else TRIALS
    start = time.perf_counter()
    measured, worst = synthetic(trials)
    measured["took"] = f"{time.perf_counter() - start:.0f} s"
    comparison = Comparison(
        name="the closed-loop rule on drawn returns",
        measured=measured,
        ratio=worst,
        ratio_label="worst FAIL rate of an honest card in the table",
        target=TARGET_FAIL_RATE,
        higher_is_better=False,
    )
    print(comparison.render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
