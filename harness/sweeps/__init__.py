"""`harness sweep`, in the order it happens: resolve the plan, every check once, the bench's too
(resolve.py) -> plan the units and hold them to the memory budget (plan.py, budget.py) -> send each
unit to the cards and the reference (dispatch.py) -> gather while watching progress (gather.py,
pace.py) -> judge, and play closed-loop rounds (closed_loop.py) -> localise what failed
(localize.py) -> write (driver.py drives it all). Plural because `harness.sweep` is the Python API's
function (harness/api.py), as `harness.bench` is the bench's."""
