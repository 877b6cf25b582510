"""Commands that drive or inspect runs: bench (+ flops, bench_report), hpo, doctor, export of a
finished run (``export_source``), starter recipes, the data cache and CI reports."""
