"""Environments for closed-loop episodes, stepped in lockstep."""

# How closed-loop episodes of seals/CartPole-v0 are stepped: the numpy copy (harness/envs/cartpole.py)
# or the real environments (harness/envs/lockstep.py). Here, not beside them, so that option
# validation and `--help` read the names without importing gymnasium or torch.
IMPLS = ("numpy", "gymnasium")
