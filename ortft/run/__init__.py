"""A training run's lifecycle: run directory, resume, the loop, stop rules, final/, gates, summary.

Torch-free: the engine (``ortft.backends``) does everything that needs a framework."""
