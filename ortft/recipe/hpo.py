"""The recipe's ``hpo:`` section: the search space of ``ortft hpo`` and its objective."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from ortft.recipe.fields import EvalMetric, PositiveInt, Section
from ortft.recipe.task import all_options
from ortft.tasks import TaskOptions


class HpoFloat(Section):
    type: Literal["uniform", "loguniform"] = Field(
        description="uniform, or loguniform (log scale)."
    )
    low: float = Field(description="Lower bound (inclusive).")
    high: float = Field(description="Upper bound (inclusive).")

    @model_validator(mode="after")
    def _bounds(self) -> HpoFloat:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.type == "loguniform" and self.low <= 0:
            raise ValueError("loguniform needs low > 0")
        return self


class HpoInt(Section):
    type: Literal["int"] = Field(description="An integer in [low, high].")
    low: int = Field(description="Lower bound (inclusive).")
    high: int = Field(description="Upper bound (inclusive).")
    step: PositiveInt = Field(1, description="Spacing of the values.")
    log: bool = Field(False, description="Sample on a log scale (needs low >= 1 and step 1).")

    @model_validator(mode="after")
    def _bounds(self) -> HpoInt:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError("log needs low >= 1 and step 1")
        return self


class HpoCategorical(Section):
    type: Literal["categorical"] = Field(description="One of a list of values.")
    choices: Annotated[list[str | int | float | bool], Field(min_length=1)] = Field(
        description="The values to choose from."
    )


HpoParam = Annotated[HpoFloat | HpoInt | HpoCategorical, Field(discriminator="type")]


class HpoPruning(Section):
    enabled: bool = Field(
        True, description="Median pruning on the metric at each eval (needs eval_every)."
    )
    startup_trials: Annotated[int, Field(ge=0)] = Field(
        2, description="Trials that always run to the end before any is pruned."
    )
    warmup_evals: Annotated[int, Field(ge=0)] = Field(
        0, description="Evals of a trial before it can be pruned."
    )


class HpoSection(Section):
    """`ortft hpo`: the search space (dotted recipe keys) and the objective."""

    metric: EvalMetric = Field(
        "eval_loss", description="Objective: this eval metric of the trial's final/ model."
    )
    direction: Literal["auto", "minimize", "maximize"] = Field(
        "auto", description="auto: minimize loss/perplexity, maximize accuracy/f1_macro."
    )
    params: dict[str, HpoParam] = Field(
        description="Search space: dotted recipe key (e.g. training.lr) -> "
        "{type: uniform|loguniform|int|categorical, ...}."
    )
    pruning: HpoPruning = Field(default_factory=HpoPruning)
    seed: int = Field(0, description="Seed of the TPE sampler.")

    @model_validator(mode="after")
    def _keys(self) -> HpoSection:
        if not self.params:
            raise ValueError("hpo.params needs at least one parameter")
        return self


def check_keys(section: HpoSection | None, root: type[BaseModel]) -> None:
    """Every searched key names a plain value of ``root`` (the Recipe, which calls this: so
    this module needs no import of schema.py)."""
    bad = [k for k in section.params if not _is_tunable(k, root)] if section else []
    if bad:
        raise ValueError(
            f"not a tunable recipe key: {', '.join(bad)} "
            "(use a dotted key of a value, e.g. training.lr)"
        )


def _is_tunable(key: str, root: type[BaseModel]) -> bool:
    """Whether `key` (dotted) names a plain value in the recipe schema (not a section, not hpo)."""
    model: Any = root
    parts = key.split(".")
    if parts[0] in ("hpo", "deepspeed"):
        return False
    for i, part in enumerate(parts):
        field = getattr(model, "model_fields", {}).get(part) if isinstance(model, type) else None
        if field is None:
            return False
        ann = field.annotation
        if ann is TaskOptions:  # task.<option>: an option of some registered task
            return len(parts) == i + 2 and parts[-1] in all_options()
        section = next(
            (
                a
                for a in (getattr(ann, "__args__", None) or (ann,))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if i == len(parts) - 1:
            return section is None
        if section is None:
            return False
        model = section
    return False
