"""Running a sweep or a bench, in the order it happens: options -> plan -> place -> fan out ->
judge -> store -> report. Kept free of heavy imports at package level: `harness --help` reads
the options from here."""
