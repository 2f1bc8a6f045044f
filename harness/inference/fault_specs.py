"""Faults injected on purpose, as the user names them, so every check the harness makes can be
seen failing: one `FaultKind` record per kind in `FAULTS`, what it strikes and how; what each does
to a card is harness/inference/faults.py. Light on purpose: option validation reads the specs
before anything imports torch, so a record names its function by "module:function" path.

A spec is `card<N>:<kind>` (N the card's position in the run: card0, card1, ...) or `all:<kind>`
(every card: a defect common to every card, which `cross_card` cannot see), and `=SIZE` after
the kinds that take a size (`all:action-bias=0.2`), and `@LAYER` after those that can strike one
layer alone (`card1:reduced-fp32@head`: LAYER as the policy names it, body.0, head, ...).

A fault that cannot strike is refused (`refuse_absent_cards`, `refuse_absent_dtypes`, `refuse_maskless`):
one on a card the run does not have, one that acts only on a dtype the run does not compute in, or
one that acts only on a masked policy in a run without one. A run that recorded such a fault and
passed would read as a negative test that passed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from harness.errors import UsageError
from harness.registry import Registry


class Strikes(Enum):
    """What a kind of fault strikes, which says when it applies and where."""

    POLICY = "the card's copy of the policy"
    """Put into the copy as the card makes it (`inject`): a bench can give its timed path these alone."""
    PROCESS = "the card's process"
    """Variables the card's process starts with (`env_vars`): MKL reads MKL_CBWR once, at load."""
    UNIT = "the card, as a unit starts"
    """The card fails as a failing card does (`strike`): it dies, or stops answering while alive."""


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: its name in a spec, what it strikes and how, and what it needs to strike."""

    name: str
    strikes: Strikes
    what: str  # what it does to the card, and which checks see it (the documentation's table)
    # POLICY: `how(policy, fault)` changes the card's copy; UNIT: `how()` as a unit starts. The
    # function, or its "module:function" path, imported on first use.
    how: str | Callable[..., None] | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # PROCESS: the variables the card's process starts with
    dtype: str | None = None  # acts only on the computations of this dtype (the card's, before its label)
    layer: bool = False  # can strike one layer alone (`@LAYER`)
    size: float | None = None  # takes a size (`=SIZE`), this one where the spec gives none
    once: bool = False  # strikes once per run, across restarts: a marker file outlives the process
    masked_only: bool = False  # acts only on a policy that takes action masks
    honest: bool = False  # no defect: a card that computes as another honest card would

    def __post_init__(self) -> None:
        process = self.strikes is Strikes.PROCESS
        if process != (self.how is None) or process != bool(self.env):
            raise ValueError(
                f"fault kind {self.name!r}: a {self.strikes.name} fault takes {'env' if process else 'how'} alone"
            )

    def spec(self) -> str:
        """How a spec writes it: `reduced-fp32[@LAYER]`, `action-bias[=SIZE]`."""
        return f"{self.name}{'[@LAYER]' if self.layer else ''}{'' if self.size is None else '[=SIZE]'}"


_FAULTS = "harness.inference.faults"
_BUILT_IN = (
    FaultKind(
        "perturb-weight",
        Strikes.POLICY,
        "one ULP added to one weight of the first layer, in the card's dtype: only the bitwise `cross_card` check "
        "sees it, and the closed loop where a near-tie flips",
        f"{_FAULTS}:inject_perturb_weight",
    ),
    FaultKind(
        "corrupt-weight",
        Strikes.POLICY,
        "the first layer's weights scaled by 1.01, a broken kernel beyond any tolerance: fails the port rule and the "
        "decisions",
        f"{_FAULTS}:inject_corrupt_weight",
    ),
    FaultKind(
        "reduced-fp32",
        Strikes.POLICY,
        "float32 matmul inputs rounded to 10 mantissa bits, as TF32 and HF32 do: every float32 Linear layer, those a "
        "precision plan keeps in float32 included; `error_ratio` above 1000",
        f"{_FAULTS}:inject_reduced_fp32",
        dtype="float32",
        layer=True,
    ),
    FaultKind(
        "fp16-accumulate",
        Strikes.POLICY,
        "float16 matmuls summed in float16 (a kernel with a float16 accumulator)",
        f"{_FAULTS}:inject_fp16_accumulate",
        dtype="float16",
        layer=True,
    ),
    FaultKind(
        "ulp-noise",
        Strikes.POLICY,
        "not a defect, the model of an honest card: every floating output of every layer moved by up to one ULP in "
        "the dtype it computes in, as another card's kernels round; `all:` gives every card the same nudges, "
        "`card<N>:` that card its own",
        f"{_FAULTS}:inject_ulp_noise",
        honest=True,
    ),
    FaultKind(
        "action-bias",
        Strikes.POLICY,
        "SIZE added to the head's output: a continuous action's mean moved, or a discrete policy's first logit (of "
        "each branch) raised; a port that loses return: fails `episode_return` and the port rule",
        f"{_FAULTS}:inject_action_bias",
        size=0.1,
    ),
    FaultKind(
        "noisy-sampler",
        Strikes.POLICY,
        "the sampling noise scaled by 1 + SIZE: a stochastic policy that explores more than it should; deterministic "
        "actions and the head untouched",
        f"{_FAULTS}:inject_noisy_sampler",
        size=0.5,
    ),
    FaultKind(
        "ignore-masks",
        Strikes.POLICY,
        "a masked policy's masks dropped: it chooses as if every action were legal; fails `masked_actions`",
        f"{_FAULTS}:inject_ignore_masks",
        masked_only=True,
    ),
    FaultKind(
        "mkl-avx2",
        Strikes.PROCESS,
        "the card's process runs with MKL_CBWR=AVX2, another honest GEMM code path: fails `cross_card`, passes the "
        "port rule with a ratio that is not 1",
        env={"MKL_CBWR": "AVX2"},
        honest=True,
    ),
    FaultKind(
        "crash-once",
        Strikes.UNIT,
        "the card's process dies on its first unit; Ray restarts it and the unit is retried: the verdicts hold",
        f"{_FAULTS}:crash",
        once=True,
    ),
    FaultKind(
        "crash-always",
        Strikes.UNIT,
        "the card's process dies on every unit: recorded as `error` rows, the run fails",
        f"{_FAULTS}:crash",
    ),
    FaultKind(
        "hang-once",
        Strikes.UNIT,
        "the card stops answering on its first unit, alive: the driver finds it hung, kills its actor, Ray restarts "
        "it and the unit is retried: the verdicts hold",
        f"{_FAULTS}:hang",
        once=True,
    ),
    FaultKind(
        "hang",
        Strikes.UNIT,
        "the card stops answering on every unit: hung again after its restart, the run ends incomplete (exit 3) naming it",
        f"{_FAULTS}:hang",
    ),
)
FAULTS: Registry[FaultKind] = Registry("fault kind", {kind.name: kind for kind in _BUILT_IN})
"""Every kind of fault by name, in the order help lists them and `inject` applies them: the
weight edits in the order perturb-weight, corrupt-weight, reduced-fp32 (each sees the weights the
one before left), and ulp-noise's hooks before action-bias's on a head both strike."""


def register_fault(kind: FaultKind, *, before: str | None = None) -> FaultKind:
    """Add a kind of fault to `FAULTS`; a name taken already is refused (ValueError)."""
    return FAULTS.register(kind.name, kind, before=before)


def kinds(strikes: Strikes | None = None) -> tuple[FaultKind, ...]:
    """The registered kinds, or those that strike `strikes`, in `FAULTS`' order."""
    return tuple(k for k in FAULTS.values() if strikes is None or k.strikes is strikes)


def kinds_help(strikes: Strikes | None = None) -> str:
    """The kinds as `--inject-fault`'s help lists them: `reduced-fp32[@LAYER], ..., ulp-noise (an honest card), ...`."""
    return ", ".join(f"{k.spec()}{' (an honest card)' if k.honest else ''}" for k in kinds(strikes))


_SPEC = re.compile(r"^(?:card(\d+)|all):([a-z0-9-]+)(?:@([A-Za-z0-9_.]+))?(?:=([-+0-9.e]+))?$")


@dataclass(frozen=True)
class Fault:
    card: int | None  # None: every card
    kind: str  # a name in FAULTS
    size: float | None = None  # of a kind that takes a size: the spec's, or the kind's default
    layer: str | None = None  # of a kind that can strike one layer: that layer (None: every layer)

    def __str__(self) -> str:
        size = "" if self.size is None or self.size == self.record.size else f"={self.size:g}"
        layer = "" if self.layer is None else f"@{self.layer}"
        return f"{'all' if self.card is None else f'card{self.card}'}:{self.kind}{layer}{size}"

    @property
    def record(self) -> FaultKind:
        """What this fault's kind strikes and how."""
        return FAULTS.get(self.kind)

    def applies_to(self, position: int) -> bool:
        return self.card is None or self.card == position

    @property
    def seed(self) -> int:
        """Of a card's ulp-noise: one for `all:` (every card nudged alike), one per card for `card<N>:`."""
        return 0 if self.card is None else self.card + 1


def striking(faults: Sequence[Fault], position: int) -> list[Fault]:
    """The faults that strike the card at `position`: its own and those for `all:`."""
    return [f for f in faults if f.applies_to(position)]


def parse_faults(specs: list[str]) -> list[Fault]:
    faults = []
    for spec in specs:
        match = _SPEC.match(spec)
        if not match or match.group(2) not in FAULTS:
            raise UsageError(
                f"--inject-fault {spec!r}: expected card<N>:<kind> or all:<kind> with kind one of {', '.join(FAULTS)}, "
                "e.g. card1:perturb-weight, or all:action-bias=0.2"
            )
        kind, layer, size = FAULTS.get(match.group(2)), match.group(3), match.group(4)
        if layer is not None and not kind.layer:
            layered = ", ".join(k.name for k in kinds() if k.layer)
            raise UsageError(
                f"--inject-fault {spec!r}: {kind.name} strikes no single layer; {layered} do, e.g. card1:reduced-fp32@head"
            )
        if size is not None and kind.size is None:
            sized = ", ".join(k.name for k in kinds() if k.size is not None)
            raise UsageError(f"--inject-fault {spec!r}: {kind.name} takes no size; {sized} do, e.g. all:action-bias=0.2")
        try:
            value = float(size) if size is not None else kind.size
        except ValueError:
            raise UsageError(f"--inject-fault {spec!r}: {size!r} is not a number, e.g. all:action-bias=0.2") from None
        faults.append(Fault(int(match.group(1)) if match.group(1) is not None else None, kind.name, value, layer))
    return faults


def refuse_absent_cards(faults: Sequence[Fault], n_cards: int | None, cards_from: str) -> None:
    """UsageError for a fault on a card a run of `n_cards` cards (None: not known yet) does not
    have; `cards_from` says where the count came from (`--cards 2`)."""
    for fault in faults:
        if fault.card is not None and n_cards is not None and fault.card >= n_cards:
            have = f"card0 to card{n_cards - 1}" if n_cards > 1 else "card0"
            raise UsageError(
                f"--inject-fault {fault}: the run has {n_cards} card(s) ({cards_from}): {have}; a fault on a card the run "
                "does not have never strikes"
            )


def refuse_absent_dtypes(faults: Sequence[Fault], dtypes: Sequence[str]) -> None:
    """UsageError for a fault that acts only on a dtype the run does not compute in (`dtypes`
    holds float32 where a precision plan keeps layers in it)."""
    for fault in faults:
        dtype = fault.record.dtype
        if dtype is not None and dtype not in dtypes:
            raise UsageError(
                f"--inject-fault {fault}: it acts only on {dtype}, and the run computes in {','.join(dtypes)}; add {dtype} "
                "to --dtypes, or the fault never strikes"
            )


def refuse_maskless(faults: Sequence[Fault], any_masked: bool, policies: list[str]) -> None:
    """UsageError for a fault that acts only on a masked policy (ignore-masks) in a run none of whose
    policies (`policies`) takes action masks."""
    for fault in faults:
        if fault.record.masked_only and not any_masked:
            raise UsageError(
                f"--inject-fault {fault}: no policy of the run takes action masks ({', '.join(policies)}); it acts only on "
                "a masked policy (MaskablePPO), or the fault never strikes"
            )


def env_vars(faults: list[Fault]) -> dict[str, str]:
    """Variables the card's process must start with: those of its PROCESS faults."""
    return {name: value for f in faults for name, value in f.record.env.items()}
