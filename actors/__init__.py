"""Ray actors, the runners: one PolicyActor per card, one ReferenceActor on the CPU, one
BenchActor per card for `harness bench`. They run and report; they never judge.

`harness` is imported first so that a worker process sets the device-backend guard before
anything it unpickles can import torch.
"""

import harness  # noqa: F401
