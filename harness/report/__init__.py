"""What a run found, for people: the summary table, `harness report` and run comparison."""
