"""The recipe: its schema (``schema``, sections in ``fields``, ``task``, ``hpo``), cross-field rules
(``rules``; each backend's in ``backends``, DeepSpeed's in ``deepspeed``, the gate grammar in
``gates``), and YAML loading with line numbers and dotted overrides (``io``)."""
