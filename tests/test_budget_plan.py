"""The memory estimate sizes the batches the plan makes, from the plan itself: every batch a
sweep makes on the driver (normal, uniform, edge; a normalizer's edge too) fits in what the
estimate counts for the driver and the object store."""

from __future__ import annotations

import pytest

from harness.policies import load_policy
from harness.sweeps.budget import estimate, input_bytes_per_row
from harness.config.command_plan import sweep_plan
from harness.config.options import SweepConfig
from harness.sweeps.plan import plan_batches, planned_batches


@pytest.mark.parametrize("name", ["cartpole", "huggy-arch"])
def test_the_estimate_counts_every_batch_the_plan_makes(name: str) -> None:
    policy = load_policy(name)
    config = sweep_plan(SweepConfig(policies=[name], batch_sizes=[1, 300]))
    made = plan_batches(config, policy)
    assert [(b.distribution, b.size) for b in made] == [(p.distribution, p.rows) for p in planned_batches(config, policy.info)]
    inputs = sum(sum(o.nbytes for o in b.obs) + b.noise.nbytes for b in made)
    assert inputs == sum(b.size for b in made) * input_bytes_per_row(policy)
    counted = estimate(config, {name: policy}, n_cards=1)
    assert counted.driver >= inputs and counted.object_store >= len(config.common.dtypes) * inputs

    # One more batch size is counted in both, at its rows' bytes.
    bigger = estimate(sweep_plan(SweepConfig(policies=[name], batch_sizes=[1, 300, 1000])), {name: policy}, n_cards=1)
    assert bigger.object_store - counted.object_store >= len(config.common.dtypes) * 1000 * input_bytes_per_row(policy)
