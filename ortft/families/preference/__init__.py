"""Preference tuning on ``{prompt, chosen, rejected}`` pairs, one family of two tasks:
preference, a causal LM tuned by DPO, IPO or ORPO (``task``: options and rows; ``losses``: the
losses, outside the wrapped module; ``reference``: the reference log-probs and their cache;
``family``: the task the core calls), and reward-model, a one-output sequence classifier
trained with the Bradley-Terry loss on the same rows (``reward``). docs/preference.md has the
recipe keys and the formulas with TRL's source lines.

The task registry (``ortft.tasks.BUILTIN``) names this package for each of the two; ``TASKS``
gives each one's options model and build. Importing this package imports no framework."""

from ortft.families.preference import family, reward, task

# task name -> (its options model, its build): one package, several tasks
TASKS = {
    "preference": (task.Options, family.build),
    "reward-model": (reward.Options, reward.build),
}

__all__ = ["TASKS"]
