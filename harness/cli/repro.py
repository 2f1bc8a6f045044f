"""`harness repro RUN_ID`: a failing check of a sweep as a folder its card's vendor can run
without the harness (harness/repro/folder.py); prints the folder's path."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.diagnose import rerun_arguments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "repro",
        help="a failing check as a folder a vendor runs without the harness: batch, outputs, model, script",
        description="Run the first failing check of RUN_ID that matches the options again on the run's cards (its "
        "batch made again, checked against the sha256 the run recorded) and write a folder under "
        "DIR/repro/RUN_ID/: the batch (inputs.npz), the card's, golden's and CPU's outputs (outputs.npz), the "
        "card's copy of the policy traced with torch.jit (model.pt), manifest.json (the check, the card, the "
        "dtype, versions and precision settings, sha256 of inputs and weights) and repro.py, which needs only "
        "torch: `python repro.py --device npu:0` reruns the model there and prints the mismatch.",
        epilog="exit: 0 the folder is written, 2 bad input (no such failing check), 3 Ray did not start or the run has "
        "not finished (stderr says how to finish it)",
    )
    rerun_arguments(parser, "rerun")
    parser.add_argument("--check", default=None, metavar="KIND", help="cpu_reference, cross_card or decisions")
    parser.add_argument("--card", default=None, metavar="LABEL", help="the card's label in the run (sim-cpu1, npu3)")
    parser.add_argument("--policy", default=None, metavar="NAME", help="the policy, as the run named it")
    parser.add_argument("--dtype", default=None, metavar="LABEL", help="the dtype's label in the run (float16)")
    parser.add_argument("--workload", default=None, metavar="NAME", help="the batch (normal-b64-s0)")
    parser.add_argument("--output", default=None, metavar="NAME", help="the output (logits, mu, action)")
    parser.add_argument(
        "--no-weights",
        action="store_true",
        help="leave the model out (its weights' sha256 and origin stay in the manifest; the script then takes --model)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.repro.folder import REPRODUCIBLE, Wanted, repro
    from harness.errors import UsageError
    from harness.store.paths import check_run_id
    from harness.store.views import require_results

    check_run_id(args.run_id, "RUN_ID")
    if args.check is not None and args.check not in REPRODUCIBLE:
        raise UsageError(f"--check {args.check}: a repro is made of {', '.join(REPRODUCIBLE)}")
    results = Path(args.results)
    require_results(results)
    wanted = Wanted(args.check, args.card, args.policy, args.dtype, args.workload, args.output)
    print(f"repro: {repro(results, args.run_id, wanted, args.address, copy_weights=not args.no_weights)}")
    return 0
