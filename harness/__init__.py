"""harness: prove an accelerator port of an RL policy right, and measure how fast it runs."""

__version__ = "0.1.0"
