"""harness: prove an accelerator port of an RL policy right, and measure how fast it runs.

Importing the package sets the device-backend guard, once, for every process that uses it:
torch >= 2.5 autoloads installed device backends on `import torch`, and torch_npu installed
without the Ascend CANN toolkit breaks that import. With TORCH_DEVICE_BACKEND_AUTOLOAD=0 torch
imports cleanly and `harness.devices` imports torch_npu itself, in a guard that reports why it
failed. Every entry point (the `harness` command, `jobs/sweep.py`, `python -m benchmarks`, the
Ray actors, the tests) imports this package before anything can import torch.
"""

import os
from typing import Any

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

__version__ = "0.1.0"

# The Python API (harness/api.py), imported when first asked for: `import harness` stays as light
# as setting the guard above, for every actor and entry point that imports it (and the layering
# contract sees no import of the top layer from the package every layer imports).
_API = {"sweep": "harness.api", "bench": "harness.api", "RunResult": "harness.api", "UsageError": "harness.errors"}
__all__ = ["RunResult", "UsageError", "__version__", "bench", "sweep"]


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
