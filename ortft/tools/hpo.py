"""``ortft hpo``: hyperparameter search with Optuna over the recipe's ``hpo:`` section.

Each trial is one ``train.run`` in this process, on the recipe's backend, with the sampled
values applied as dotted overrides (validated like any override) and the ONNX export off.
Trials run in-process rather than as subprocesses because median pruning needs the eval
metric *while* a trial trains: ``train.run`` calls an ``on_eval`` hook after every eval, the
hook reports the value to Optuna and raises ``errors.Stopped`` when the median rule prunes the
trial. The study lives in SQLite (default ``<runs>/<stem>-hpo/study.db``): running the same
command again loads it and runs only the trials still missing (``--trials`` is the total of
finished trials). A trial cut off by Ctrl-C, or left running by a killed process, is marked
failed and its parameters are queued to run again first.

Layout: ``runs/<stem>-hpo/trial-NNN/`` (each a normal run directory), ``study.db``, and
``<stem>-best.yaml``: the recipe with the best trial's values, ready for ``ortft train``.
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ortft.core.errors import GateError, InputError, Interrupted, RecipeError, RunError, Stopped
from ortft.recipe import io as recipe_io
from ortft.recipe.backends import check_installed
from ortft.recipe.schema import HpoCategorical, HpoFloat, HpoSection, metric_mode
from ortft.run import lifecycle as train
from ortft.run.summary import RunSummary

log = logging.getLogger("ortft")

# recipe fields holding input paths: made absolute in the best recipe, which lives elsewhere
PATH_FIELDS = ("model.name_or_path", "model.tokenizer.path", "data.train", "data.eval")


def _literal(value: Any) -> str:
    """A value as an override string that YAML reads back as the same value."""
    if isinstance(value, float):
        text = repr(value)
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _suggest(trial: Any, key: str, space: Any) -> Any:
    if isinstance(space, HpoFloat):
        return trial.suggest_float(key, space.low, space.high, log=space.type == "loguniform")
    if isinstance(space, HpoCategorical):
        return trial.suggest_categorical(key, space.choices)
    return trial.suggest_int(key, space.low, space.high, step=space.step, log=space.log)


def _extremes(space: Any) -> list[Any]:
    return list(space.choices) if isinstance(space, HpoCategorical) else [space.low, space.high]


def check_space(path: Path, overrides: list[str], spec: HpoSection) -> None:
    """Every bound and choice of the search space makes a valid recipe that this install can
    train (all problems at once)."""
    problems = []
    for key, space in spec.params.items():
        for value in _extremes(space):
            try:
                extreme = recipe_io.load(
                    path, [*overrides, f"{key}={_literal(value)}"], check_files=False
                )
                check_installed(extreme.recipe)  # a backend.name choice ORT training lacks
            except RecipeError as err:
                problems += [f"hpo.params.{key}: {value!r} gives: {p}" for p in err.problems]
    if problems:
        raise RecipeError(problems, source=str(path))


def best_recipe_text(loaded: recipe_io.LoadedRecipe, params: dict[str, Any], header: str) -> str:
    data = copy.deepcopy(loaded.raw)
    data.pop("hpo", None)
    for key, value in params.items():
        recipe_io.set_value(data, key, value)
    for key in PATH_FIELDS:
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and not node.startswith(recipe_io.PKG_PREFIX):
            resolved = loaded.resolve_path(node)
            if resolved.exists() and not Path(node).is_absolute():
                recipe_io.set_value(data, key, str(resolved))
    return header + yaml.safe_dump(data, sort_keys=False)


def default_dir(loaded: recipe_io.LoadedRecipe) -> Path:
    run_dir = train.resolve_run_dir(loaded, None)
    if run_dir.name.endswith("-hpo"):  # recipes/quickstart-hpo.yaml → runs/quickstart-hpo
        return run_dir
    return run_dir.with_name(f"{run_dir.name}-hpo")


def run(
    recipe: Path,
    overrides: list[str],
    trials: int,
    study_name: str | None = None,
    storage: str | None = None,
    output_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the trials still missing from ``trials`` (see the module docstring); the result table."""
    from optuna.trial import TrialState

    loaded = recipe_io.load(recipe, overrides)
    spec = loaded.recipe.hpo
    if spec is None:
        raise RecipeError(
            "no hpo section: add one with the search space (see docs/evaluate.md: ortft hpo)",
            source=str(recipe),
        )
    if "backend.name" not in spec.params:  # else check_space checks each choice
        check_installed(loaded.recipe)
    check_space(recipe, overrides, spec)
    base = output_dir or default_dir(loaded)
    base.mkdir(parents=True, exist_ok=True)
    storage = storage or f"sqlite:///{(base / 'study.db').resolve()}"
    study_name = study_name or recipe.stem
    direction = (
        spec.direction
        if spec.direction != "auto"
        else ("minimize" if metric_mode(spec.metric) == "min" else "maximize")
    )
    study = _study(loaded, spec, study_name, storage, direction)
    _requeue_interrupted(study)
    from ortft.run.trackers.study import Study

    trackers = Study(loaded.recipe.logging, base, study_name)  # each trial a child run
    objective = _objective(recipe, [*overrides, *trackers.overrides], spec, base, trackers.parent)
    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    todo = max(0, trials - done)
    log.info(
        "hpo: study %s (%s %s) in %s: %d trial(s) finished, %d to run",
        study_name,
        direction,
        spec.metric,
        storage,
        done,
        todo,
    )
    started = time.time()
    if todo:
        try:
            study.optimize(objective, n_trials=todo)
        finally:
            trackers.close()
    return _result(study, loaded, spec, base, storage, direction, time.time() - started)


def _study(
    loaded: recipe_io.LoadedRecipe, spec: HpoSection, name: str, storage: str, direction: str
) -> Any:
    """The Optuna study in ``storage``: created, or loaded to continue (same direction only)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)  # ortft logs one line per trial
    pruner: Any = (
        optuna.pruners.MedianPruner(
            n_startup_trials=spec.pruning.startup_trials,
            n_warmup_steps=spec.pruning.warmup_evals * (loaded.recipe.training.eval_every or 0),
        )
        if spec.pruning.enabled
        else optuna.pruners.NopPruner()
    )
    try:
        study = optuna.create_study(
            storage=storage,
            study_name=name,
            direction=direction,  # type: ignore[arg-type]  # "minimize" or "maximize" (the schema)
            load_if_exists=True,
            pruner=pruner,
            sampler=optuna.samplers.TPESampler(seed=spec.seed),
        )
    except (ValueError, ImportError) as err:
        raise InputError(f"study {name} in {storage}: {err}") from None
    if study.direction.name.lower() != direction:
        raise InputError(
            f"study {name} in {storage} is to {study.direction.name.lower()}; "
            f"this recipe wants {direction}: use another --study"
        )
    return study


def _requeue_interrupted(study: Any) -> None:
    """A trial interrupted (or left RUNNING by a killed process) runs again first."""
    from optuna.trial import TrialState

    for t in study.trials:
        if t.state == TrialState.RUNNING:
            study.tell(t.number, state=TrialState.FAIL)
            t.user_attrs["interrupted"] = True
        if t.user_attrs.get("interrupted") and t.number not in study.user_attrs.get("requeued", []):
            study.enqueue_trial(t.params, skip_if_exists=False)
            study.set_user_attr("requeued", [*study.user_attrs.get("requeued", []), t.number])
            log.info("hpo: trial %d was interrupted; its parameters run again", t.number)


def _objective(
    recipe: Path, overrides: list[str], spec: HpoSection, base: Path, parent: dict[str, str]
) -> Callable[[Any], float]:
    """One trial: a ``train.run`` with the sampled values, in ``base/trial-NNN``; its metric."""
    import optuna

    def objective(trial: Any) -> float:
        params = {key: _suggest(trial, key, space) for key, space in spec.params.items()}
        run_dir = base / f"trial-{trial.number:03d}"
        trial.set_user_attr("run_dir", str(run_dir))
        if run_dir.exists():  # left by a study that no longer exists (e.g. study.db removed)
            log.warning("hpo: removing %s, which no trial of this study owns", run_dir)
            shutil.rmtree(run_dir)
        shown = "  ".join(f"{k}={_literal(v)}" for k, v in params.items())
        log.info("hpo: trial %d: %s", trial.number, shown)
        trial_loaded = recipe_io.load(
            recipe,
            [
                *overrides,
                *(f"{k}={_literal(v)}" for k, v in params.items()),
                "export.enabled=false",
            ],
        )

        def on_eval(step: int, metrics: dict[str, float]) -> None:
            value = metrics[spec.metric.removeprefix("eval_")]
            trial.report(value, step)
            if trial.should_prune():
                raise Stopped(
                    f"pruned at step {step}: {spec.metric} {value:.4f} is worse than "
                    "the median of earlier trials"
                )

        try:
            summary = RunSummary.coerce(
                train.run(trial_loaded, output_dir=run_dir, on_eval=on_eval, tracker_parent=parent)
            )
        except Stopped as err:
            log.info("hpo: trial %d %s", trial.number, err)
            raise optuna.TrialPruned(str(err)) from None
        except Interrupted:
            trial.set_user_attr("interrupted", True)
            raise
        except GateError as err:  # the metrics are still good for the search
            summary = RunSummary.coerce(err.summary or {})
            trial.set_user_attr("gates_failed", True)
        except RunError as err:  # e.g. a diverging lr: the search goes on (input errors stop it)
            trial.set_user_attr("error", str(err))
            log.warning("hpo: trial %d failed: %s", trial.number, err)
            return float("nan")  # Optuna records NaN as a failed trial
        value = summary.metrics.get(spec.metric)
        if value is None:
            raise RunError(f"trial {trial.number}: the run reported no {spec.metric}")
        log.info("hpo: trial %d: %s %.4f", trial.number, spec.metric, value)
        return float(value)

    return objective


def _result(
    study: Any,
    loaded: recipe_io.LoadedRecipe,
    spec: HpoSection,
    base: Path,
    storage: str,
    direction: str,
    wall_s: float,
) -> dict[str, Any]:
    from optuna.trial import TrialState

    rows = []
    for t in study.trials:
        rows.append(
            {
                "number": t.number,
                "state": t.state.name.lower(),
                "value": t.value,
                "last_step": max(t.intermediate_values, default=None),
                "params": t.params,
                "run_dir": t.user_attrs.get("run_dir"),
                "duration_s": t.duration.total_seconds() if t.duration else None,
            }
        )
    result: dict[str, Any] = {
        "study": study.study_name,
        "storage": storage,
        "metric": spec.metric,
        "direction": direction,
        "wall_time_s": round(wall_s, 1),
        "trials": rows,
        "best": None,
    }
    if any(t.state == TrialState.COMPLETE for t in study.trials):
        best = study.best_trial
        stem = loaded.path.stem if loaded.path else "recipe"
        path = base / f"{stem}-best.yaml"
        header = (
            f"# Best trial of ortft hpo study '{study.study_name}': trial {best.number}, "
            f"{spec.metric} {best.value:.4f}.\n# Run: ortft train {path}\n"
        )
        path.write_text(best_recipe_text(loaded, best.params, header))
        result["best"] = {
            "number": best.number,
            "value": best.value,
            "params": best.params,
            "run_dir": best.user_attrs.get("run_dir"),
            "recipe": str(path),
        }
    return result


def format_table(result: dict[str, Any]) -> str:
    keys = sorted({k for row in result["trials"] for k in row["params"]})
    head = ["trial", "state", result["metric"], "step", *keys, "time_s"]
    body = []
    for row in result["trials"]:
        value = f"{row['value']:.4f}" if row["value"] is not None else "-"
        params = [_short(row["params"].get(k)) for k in keys]
        dur = f"{row['duration_s']:.0f}" if row["duration_s"] is not None else "-"
        body.append(
            [str(row["number"]), row["state"], value, str(row["last_step"] or "-"), *params, dur]
        )
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *body]
    ]
    best = result["best"]
    if best:
        lines += [
            "",
            f"best: trial {best['number']}  {result['metric']} {best['value']:.4f}",
            f"run:    {best['run_dir']}",
            f"recipe: {best['recipe']}",
        ]
    else:
        lines += ["", "no trial completed"]
    return "\n".join(lines)


def _short(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)
