"""Commands that drive or inspect runs: bench, hpo, doctor, extensions, starter recipes, CI reports."""
