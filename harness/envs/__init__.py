"""Environments for closed-loop episodes, stepped in lockstep."""
