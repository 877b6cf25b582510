"""Task families: each one package holding all of a task (or a group of tasks): its options,
rows, model and processor loading, metrics, ONNX graphs, runner, model card, predict and eval.
A family sits above the core and is reached only through the task registry
(``ortft.tasks.BUILTIN``); the core asks it through ``ortft.tasks.protocols``."""
