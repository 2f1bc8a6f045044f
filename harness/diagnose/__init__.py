"""`harness diagnose RUN_ID`: the fewest layers to keep in float32 for a failing dtype to pass."""
