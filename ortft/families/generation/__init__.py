"""Text generation, one family of three tasks: causal-lm (``causal_lm``), instruction
(``instruction``) and seq2seq (``seq2seq``), each a pure task (options, rows, metrics); what the
core calls on them (``family``); a decoder's graph with its KV cache and generation check
(``decoder_graph``); seq2seq's encoder and decoder graphs and their runner
(``seq2seq_graphs``); the model card's code (``card``); and ``ortft predict``'s generation
(``predict``). The numpy generation loop (``ortft.export.generation``) and what every
generation check shares (``ortft.export.decoder``) stay in the core: speech uses them too.

The task registry (``ortft.tasks.BUILTIN``) names this package for each of the three; ``TASKS``
gives each one's options model and build. Importing this package imports no framework."""

from ortft.families.generation import causal_lm, instruction, seq2seq
from ortft.families.generation.family import build_causal_lm, build_instruction, build_seq2seq

# task name -> (its options model, its build): one package, several tasks
TASKS = {
    "causal-lm": (causal_lm.Options, build_causal_lm),
    "instruction": (instruction.Options, build_instruction),
    "seq2seq": (seq2seq.Options, build_seq2seq),
}

__all__ = ["TASKS"]
