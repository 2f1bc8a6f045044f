"""What the two fuzz tests (test_fuzz_cli.py, test_fuzz_policy_files.py) share: how many examples
each draws, and how hypothesis draws them.

EXAMPLES is per command and per policy; docs/ci.md ("The fuzz tests") states it, and
tests/test_docs.py holds the page to it. HARNESS_FUZZ_EXAMPLES asks for more, for a deeper
search by hand. Examples are derandomized and nothing is kept between runs, so CI draws the same
ones every run and the same count gives the same examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "40"))

fuzz_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
