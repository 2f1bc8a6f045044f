"""Entry point for `ray job submit -- python jobs/sweep.py [sweep options]`.

It parses the same options as `harness sweep` and calls the same driver, with the same exit codes:
a run that ends incomplete (exit 3) fails the job, and its log says what was lost and the
`ray job submit` that finishes it. A job runs in a copy of the working directory, so `--results`
must be an absolute path that outlives that copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The job's copy of the repository comes first, so the code that runs is the code submitted;
# importing `harness` sets the device-backend guard before anything can import torch.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cli import Parser, answer
from harness.cli import sweep as sweep_command
from harness.errors import UsageError
from harness.config.fields import add_arguments
from harness.config.options import SweepConfig


def parser() -> Parser:
    """The sweep's options, as `harness sweep` takes them."""
    options = Parser(prog="jobs/sweep.py", description="harness sweep, as a Ray job")
    add_arguments(options, SweepConfig)
    return options


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def job() -> int:
        if not Path(getattr(args, "results", "")).is_absolute():
            raise UsageError("--results must be an absolute path: a Ray job runs in a temporary copy of the working dir")
        again = "ray job submit --address http://DASHBOARD --working-dir . -- python jobs/sweep.py"
        return sweep_command.run(args, "jobs/sweep.py", again)

    return answer(job, "jobs/sweep.py")


if __name__ == "__main__":
    sys.exit(main())
