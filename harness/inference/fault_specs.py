"""Faults injected on purpose, as the user names them, so every check the harness makes can be
seen failing; what each does to a card is harness/inference/faults.py. Light on purpose: option
validation reads the specs before anything imports torch.

A spec is `card<N>:<kind>` (N the card's position in the run: card0, card1, ...) or `all:<kind>`
(every card: a defect common to every card, which `cross_card` cannot see), and `=SIZE` after
the kinds that take a size (`all:action-bias=0.2`), and `@LAYER` after those that can strike one
layer alone (`card1:reduced-fp32@head`: LAYER as the policy names it, body.0, head, ...):
  ulp-noise        an honest card, not a defect: every floating output of every layer moved by up to
                   one ULP in the dtype it computes in, as another card's kernels round
                   (`add_ulp_noise`); `all:` gives every card the same nudges, `card<N>:` that card its own
  perturb-weight   one ULP added to one weight of the first layer, in the card's dtype
  corrupt-weight   the first layer's weights scaled by 1.01: a broken kernel, beyond any tolerance
  reduced-fp32     float32 matmul inputs rounded to 10 mantissa bits, as TF32 / HF32 do: every
                   float32 Linear layer, those a precision plan keeps in float32 included
  fp16-accumulate  float16 matmuls summed in float16 (a kernel with a float16 accumulator)
  action-bias      SIZE (default 0.1) added to the head's output: a continuous action's mean moved,
                   or a discrete policy's first logit (of each branch) raised; a port that loses return
  noisy-sampler    the sampling noise scaled by 1 + SIZE (default 0.5): a stochastic policy that
                   explores more than it should; deterministic actions are untouched
  ignore-masks     a masked policy's masks dropped: it chooses as if every action were legal
  mkl-avx2         the card's process runs with MKL_CBWR=AVX2 (another, honest, GEMM code path)
  crash-once       the card's process dies on its first unit; Ray restarts it and the unit is retried
  crash-always     the card's process dies on every unit: the sweep records it and fails
  hang-once        the card stops answering on its first unit, alive: the driver finds it hung, kills
                   its actor, Ray restarts it and the unit is retried
  hang             the card stops answering on every unit: hung again after its restart, the run
                   ends incomplete (exit 3) naming it
A `-once` fault strikes once per run, across restarts: it leaves a marker file that outlives the
process.

A fault that cannot strike is refused (`refuse_absent_cards`, `refuse_absent_dtypes`): one on a card the run does not have, or
one that acts only on a dtype the run does not compute in. A run that recorded such a fault and
passed would read as a negative test that passed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import UsageError

# What `inject` puts into a policy's copy: the faults a bench can give its timed path alone.
MODEL_KINDS = (
    "perturb-weight",
    "corrupt-weight",
    "reduced-fp32",
    "fp16-accumulate",
    "ulp-noise",
    "action-bias",
    "noisy-sampler",
    "ignore-masks",
)
KINDS = (*MODEL_KINDS, "mkl-avx2", "crash-once", "crash-always", "hang-once", "hang")
# The faults that act only on the computations of one dtype (the card's dtype, before its label).
DTYPE_OF_KIND = {"reduced-fp32": "float32", "fp16-accumulate": "float16"}
# The kinds that can strike one layer alone (`@LAYER`).
LAYER_KINDS = ("reduced-fp32", "fp16-accumulate")
# The kinds that take a size (`all:action-bias=0.2`), and the size they take without one.
SIZES = {"action-bias": 0.1, "noisy-sampler": 0.5}
_SPEC = re.compile(r"^(?:card(\d+)|all):([a-z0-9-]+)(?:@([A-Za-z0-9_.]+))?(?:=([-+0-9.e]+))?$")


@dataclass(frozen=True)
class Fault:
    card: int | None  # None: every card
    kind: str
    size: float | None = None  # the kinds of SIZES: the spec's, or the default
    layer: str | None = None  # the kinds of LAYER_KINDS: the one layer it strikes (None: every layer)

    def __str__(self) -> str:
        size = "" if self.size is None or self.size == SIZES.get(self.kind) else f"={self.size:g}"
        layer = "" if self.layer is None else f"@{self.layer}"
        return f"{'all' if self.card is None else f'card{self.card}'}:{self.kind}{layer}{size}"

    def applies_to(self, position: int) -> bool:
        return self.card is None or self.card == position

    @property
    def seed(self) -> int:
        """Of a card's ulp-noise: one for `all:` (every card nudged alike), one per card for `card<N>:`."""
        return 0 if self.card is None else self.card + 1


def parse_faults(specs: list[str]) -> list[Fault]:
    faults = []
    for spec in specs:
        match = _SPEC.match(spec)
        if not match or match.group(2) not in KINDS:
            raise UsageError(
                f"--inject-fault {spec!r}: expected card<N>:<kind> or all:<kind> with kind one of {', '.join(KINDS)}, "
                "e.g. card1:perturb-weight, or all:action-bias=0.2"
            )
        kind, layer, size = match.group(2), match.group(3), match.group(4)
        if layer is not None and kind not in LAYER_KINDS:
            raise UsageError(
                f"--inject-fault {spec!r}: {kind} strikes no single layer; {', '.join(LAYER_KINDS)} do, "
                "e.g. card1:reduced-fp32@head"
            )
        if size is not None and kind not in SIZES:
            raise UsageError(f"--inject-fault {spec!r}: {kind} takes no size; {', '.join(SIZES)} do, e.g. all:action-bias=0.2")
        try:
            value = float(size) if size is not None else SIZES.get(kind)
        except ValueError:
            raise UsageError(f"--inject-fault {spec!r}: {size!r} is not a number, e.g. all:action-bias=0.2") from None
        faults.append(Fault(int(match.group(1)) if match.group(1) is not None else None, kind, value, layer))
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
        dtype = DTYPE_OF_KIND.get(fault.kind)
        if dtype is not None and dtype not in dtypes:
            raise UsageError(
                f"--inject-fault {fault}: it acts only on {dtype}, and the run computes in {','.join(dtypes)}; add {dtype} "
                "to --dtypes, or the fault never strikes"
            )


def refuse_maskless(faults: Sequence[Fault], any_masked: bool, policies: list[str]) -> None:
    """UsageError for ignore-masks in a run none of whose policies (`policies`) takes action masks."""
    for fault in faults:
        if fault.kind == "ignore-masks" and not any_masked:
            raise UsageError(
                f"--inject-fault {fault}: no policy of the run takes action masks ({', '.join(policies)}); it acts only on "
                "a masked policy (MaskablePPO), or the fault never strikes"
            )


def env_vars(faults: list[Fault]) -> dict[str, str]:
    """Variables the card's process must start with (MKL reads MKL_CBWR once, at load)."""
    return {"MKL_CBWR": "AVX2"} if any(f.kind == "mkl-avx2" for f in faults) else {}
