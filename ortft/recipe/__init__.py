"""The recipe: its schema (``schema``), cross-field rules, and YAML loading with line numbers
and dotted overrides (``io``)."""
