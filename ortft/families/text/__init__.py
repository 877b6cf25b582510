"""Text encoders with a task head, one family of four tasks: sequence-classification
(``classification``), token-classification (``token_classification``), masked-lm
(``masked_lm``) and question-answering (``question_answering``), each one file (options, rows,
metrics, the hooks the core calls on it); and ``ortft predict`` of the three whose output is
not a label (``predict``: tags, an answer, filled masks). Their export is the exporter's single
graph of ``logits``. SQuAD's answer metrics (``ortft.tasks.squad``) and macro-F1
(``ortft.tasks.metrics``) stay in the core: seq2seq and image classification score with them
too.

The task registry (``ortft.tasks.BUILTIN``) names this package for each of the four; ``TASKS``
gives each one's options model and build. Importing this package imports no framework."""

from ortft.families.text import classification, masked_lm, question_answering, token_classification

# task name -> (its options model, its build): one package, several tasks
TASKS = {
    "sequence-classification": (classification.Options, classification.build),
    "token-classification": (token_classification.Options, token_classification.build),
    "masked-lm": (masked_lm.Options, masked_lm.build),
    "question-answering": (question_answering.Options, question_answering.build),
}

__all__ = ["TASKS"]
