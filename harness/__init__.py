"""harness: prove an accelerator port of an RL policy right, and measure how fast it runs.

Importing the package sets the device-backend guard, once, for every process that uses it:
torch >= 2.5 autoloads installed device backends on `import torch`, and torch_npu installed
without the Ascend CANN toolkit breaks that import. With TORCH_DEVICE_BACKEND_AUTOLOAD=0 torch
imports cleanly and `harness.devices` imports torch_npu itself, in a guard that reports why it
failed. Every entry point (the `harness` command, `jobs/sweep.py`, `python -m benchmarks`, the
Ray actors, the tests) imports this package before anything can import torch.
"""

import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

__version__ = "0.1.0"
