"""Recipe loading: defaults, overrides, and one readable line per problem (with its YAML line)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from ortft.core.errors import EXIT_USAGE, RecipeError, UsageError
from ortft.recipe import io as recipe_io
from ortft.recipe.schema import Recipe

# A minimal valid recipe: a tiny model from config, a tokenizer trained locally, a local CSV.
MINIMAL = """\
model:
  from_config:
    architecture: bert
    hidden_size: 32
    num_layers: 2
    num_heads: 2
  tokenizer:
    train: {kind: wordpiece, vocab_size: 200}
task: sequence-classification
data:
  train: train.csv
"""


def write(folder: Path, text: str, name: str = "recipe.yaml", data: bool = True) -> Path:
    """Write a recipe (and an empty train.csv beside it, so path checks pass)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    if data:
        (folder / "train.csv").write_text("text,label\nhello,a\n")
    return path


def load_error(path: Path | None, overrides: list[str] | None = None, **kw) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        recipe_io.load(path, overrides or [], **kw)
    assert info.value.exit_code == EXIT_USAGE
    return info.value


# --------------------------------------------------------------------------- defaults


def test_minimal_recipe_gets_the_documented_defaults(tmp_path):
    loaded = recipe_io.load(write(tmp_path, MINIMAL))
    r = loaded.recipe
    assert isinstance(r, Recipe)
    assert r.task.name == "sequence-classification"  # the string form becomes {name: ...}
    assert r.backend.name == "ort" and r.backend.allow_fallback is False
    assert r.precision.dtype == "fp32"
    assert r.optimizer.name == "adamw"
    assert r.hardware.device == "auto"
    assert r.data.format == "auto" and r.data.max_length == 128 and r.data.eval_fraction == 0.1
    assert r.training.batch_size == 8 and r.training.lr == 5e-5 and r.training.seed == 42
    assert r.checkpoint.resume == "auto" and r.export.enabled is True and r.export.opset == 20
    assert r.model.tokenizer.train.kind == "wordpiece"
    assert loaded.path == tmp_path / "recipe.yaml"
    assert loaded.base_dir == tmp_path.resolve()


def test_epochs_default_to_one_only_without_max_steps(tmp_path):
    path = write(tmp_path, MINIMAL)
    plain = recipe_io.load(path).recipe.training
    assert plain.epochs == 1.0 and plain.max_steps is None
    stepped = recipe_io.load(path, ["training.max_steps=20"]).recipe.training
    assert stepped.max_steps == 20 and stepped.epochs is None
    both = recipe_io.load(path, ["training.epochs=3", "training.max_steps=5"]).recipe.training
    assert both.epochs == 3.0 and both.max_steps == 5


# --------------------------------------------------------------------------- overrides


def test_override_values_parse_as_yaml_scalars(tmp_path):
    loaded = recipe_io.load(
        write(tmp_path, MINIMAL),
        ["training.max_steps=20", "backend.name=torch", "training.lr=1e-3", "data.shuffle=false"],
    )
    r = loaded.recipe
    assert r.training.max_steps == 20 and isinstance(r.training.max_steps, int)
    assert r.backend.name == "torch"
    assert r.training.lr == pytest.approx(1e-3)
    assert r.data.shuffle is False
    assert loaded.raw["training"]["max_steps"] == 20  # the merged mapping keeps the parsed value


def test_override_creates_nested_sections_the_yaml_does_not_have(tmp_path):
    loaded = recipe_io.load(
        write(tmp_path, MINIMAL),
        ["checkpoint.save_every=5", "export.enabled=false", "model.tokenizer.train.vocab_size=500"],
    )
    r = loaded.recipe
    assert r.checkpoint.save_every == 5
    assert r.export.enabled is False
    assert r.model.tokenizer.train.vocab_size == 500
    assert r.model.tokenizer.train.kind == "wordpiece"  # siblings are kept


def test_override_of_a_string_section_keeps_working(tmp_path):
    # `task: sequence-classification` is shorthand for {name: ...}; a dotted override still applies
    r = recipe_io.load(write(tmp_path, MINIMAL), ["task.name=causal-lm"]).recipe
    assert r.task.name == "causal-lm"


@pytest.mark.parametrize("bad", ["foo", "=1", "training..lr=1", ".lr=1", "training.=1"])
def test_malformed_override_is_a_usage_error(tmp_path, bad):
    with pytest.raises(UsageError) as info:
        recipe_io.load(write(tmp_path, MINIMAL), [bad])
    assert info.value.exit_code == EXIT_USAGE
    assert "section.key=value" in str(info.value)
    assert bad in str(info.value)


def test_unknown_key_via_override_suggests_the_closest(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["training.max_step=20"])
    assert "training.max_step" in str(err)
    assert "did you mean 'max_steps'" in str(err)


def test_unknown_nested_key_via_override_lists_the_valid_keys(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["data.zzz.key=1"])
    # a key the YAML does not have is reported as the command-line override it came from
    assert re.search(r"data\.zzz \(command-line override\): unknown key", str(err))
    assert "valid keys:" in str(err) and "text_column" in str(err)


# --------------------------------------------------------------------------- errors


def test_unknown_key_in_yaml_names_path_line_and_suggestion(tmp_path):
    path = write(tmp_path, MINIMAL + "training:\n  batch_size: 4\n  max_step: 20\n")
    err = load_error(path)
    assert err.problems == ["training.max_step (line 14): unknown key; did you mean 'max_steps'?"]
    assert str(err).startswith(str(path))
    assert "\n" not in str(err)  # one problem: one line


def test_every_problem_is_reported_at_once(tmp_path):
    text = MINIMAL.replace("  train: train.csv", "  train: train.csv\n  max_lenght: 64") + (
        "training:\n"
        "  max_step: 20\n"  # unknown key
        "  lr: 2.0\n"  # out of range
        "backend:\n"
        "  name: onnx\n"  # not a choice
    )
    err = load_error(write(tmp_path, text))
    assert len(err.problems) == 4, err.problems
    message = str(err)
    assert "4 problems" in message
    assert "data.max_lenght (line 12): unknown key; did you mean 'max_length'?" in message
    assert "training.max_step (line 14): unknown key; did you mean 'max_steps'?" in message
    assert "training.lr (line 15)" in message
    assert "backend.name (line 17)" in message
    # the header line, then one line per problem
    assert message.count("\n") == len(err.problems)
    assert all(line.startswith("  - ") for line in message.splitlines()[1:])


def test_malformed_yaml_gives_line_and_column(tmp_path):
    path = write(tmp_path, "model:\n  from_config: {architecture: bert\ntask: x\n")
    err = load_error(path)
    assert "malformed YAML" in str(err)
    assert "line " in str(err) and "column " in str(err)
    assert str(err).startswith(str(path))


def test_malformed_yaml_bad_indent_points_at_the_line(tmp_path):
    path = write(tmp_path, "model:\n  name_or_path: x\n task: causal-lm\n")
    err = load_error(path)
    assert "line 3, column 2: malformed YAML" in str(err)


@pytest.mark.parametrize(
    "text, needle",
    [("", "the recipe is empty"), ("- a\n- b\n", "a recipe must be a mapping of sections")],
)
def test_empty_or_non_mapping_recipe(tmp_path, text, needle):
    assert needle in str(load_error(write(tmp_path, text)))


def test_missing_recipe_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="recipe file not found"):
        recipe_io.load(tmp_path / "nope.yaml")


def test_enum_error_lists_the_valid_choices(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["backend.name=onnx"])
    assert "backend.name" in str(err)
    assert "'ort'" in str(err) and "'torch'" in str(err)
    err = load_error(write(tmp_path, MINIMAL), ["task=translation"])
    assert "'sequence-classification'" in str(err) and "'causal-lm'" in str(err)


def test_required_sections_are_named(tmp_path):
    err = load_error(write(tmp_path, "task: causal-lm\n"))
    message = str(err)
    assert "model" in message and "data" in message
    assert "Field required" in message


@pytest.mark.parametrize(
    "extra",
    [
        ["model.name_or_path=./some-model"],  # both given
        ["model.from_config=null"],  # neither given
    ],
)
def test_exactly_one_model_source(tmp_path, extra):
    err = load_error(write(tmp_path, MINIMAL), extra, check_files=False)
    assert "give exactly one of model.name_or_path or model.from_config" in str(err)


def test_from_config_needs_a_tokenizer(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["model.tokenizer.train=null"])
    assert "needs model.tokenizer.path or model.tokenizer.train" in str(err)


def test_tokenizer_path_and_train_are_exclusive(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["model.tokenizer.path=./tok"], check_files=False)
    assert "either tokenizer.path or tokenizer.train, not both" in str(err)


def test_num_heads_must_divide_hidden_size(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["model.from_config.num_heads=3"])
    assert "num_heads (3) must divide hidden_size (32)" in str(err)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (
            ["precision=bf16", "hardware.device=cpu"],
            "precision.dtype=bf16 on cpu needs backend.name=torch",
        ),
        (["precision.dtype=fp16", "hardware.device=cpu"], "precision.dtype=fp16 needs CUDA"),
        (["deepspeed.zero_optimization.stage=3"], "ortft supports ZeRO stages 0, 1 and 2"),
        (["deepspeed=ds.yaml"], "is not a .json file path"),
    ],
)
def test_unwired_features_fail_loudly(tmp_path, overrides, needle):
    err = load_error(write(tmp_path, MINIMAL), overrides, check_files=False)
    assert needle in str(err)


def test_ort_fused_adamw_needs_cuda_and_ort(tmp_path):
    path = write(tmp_path, MINIMAL)
    err = load_error(path, ["optimizer.name=adamw_ort_fused", "hardware.device=cpu"])
    assert "adamw_ort_fused needs CUDA" in str(err)
    err = load_error(path, ["optimizer.name=adamw_ort_fused", "backend.name=torch"])
    assert "adamw_ort_fused needs backend.name=ort" in str(err)
    # on auto/cuda with ort it validates (whether CUDA is present is checked at run time)
    r = recipe_io.load(path, ["optimizer.name=adamw_ort_fused"]).recipe
    assert r.optimizer.name == "adamw_ort_fused"


# --------------------------------------------------------------------------- paths


def test_missing_data_file_names_the_field_and_the_path(tmp_path):
    path = write(tmp_path, MINIMAL.replace("train.csv", "nowhere/train.csv"))
    err = load_error(path)
    assert "data.train" in str(err)
    assert str(tmp_path.resolve() / "nowhere" / "train.csv") in str(err)
    assert "does not exist" in str(err)
    # check_files=False skips the check (used where data is looked at later)
    recipe_io.load(path, check_files=False)


def test_missing_eval_and_model_paths_are_all_reported(tmp_path):
    err = load_error(
        write(tmp_path, MINIMAL),
        [
            "data.eval=missing-eval.jsonl",
            "model.tokenizer.train=null",
            "model.tokenizer.path=./no-tok",
        ],
    )
    assert len(err.problems) == 2, err.problems
    assert any(p.startswith("data.eval:") for p in err.problems)
    assert any(p.startswith("model.tokenizer.path:") for p in err.problems)


def test_a_hub_name_is_not_checked_as_a_file(tmp_path):
    r = recipe_io.load(write(tmp_path, MINIMAL), ["data.train=imdb"]).recipe
    assert r.data.train == "imdb"


def test_relative_paths_resolve_against_the_recipe_folder_not_the_cwd(tmp_path, monkeypatch):
    recipe_dir = tmp_path / "project" / "recipes"
    path = write(recipe_dir, MINIMAL.replace("train.csv", "data/train.csv"), data=False)
    (recipe_dir / "data").mkdir()
    (recipe_dir / "data" / "train.csv").write_text("text,label\nhi,a\n")
    # a decoy beside the cwd that must not be picked up
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    (elsewhere / "data" / "train.csv").write_text("text,label\ndecoy,b\n")
    monkeypatch.chdir(elsewhere)

    loaded = recipe_io.load(Path("..") / "project" / "recipes" / "recipe.yaml")
    assert loaded.base_dir == recipe_dir.resolve()
    expected = recipe_dir.resolve() / "data" / "train.csv"
    assert loaded.resolve_path(loaded.recipe.data.train) == expected

    # and a file that exists only relative to the cwd is reported missing
    (recipe_dir / "data" / "train.csv").unlink()
    err = load_error(path)
    assert str(recipe_dir.resolve() / "data" / "train.csv") in str(err)


def test_absolute_paths_are_kept(tmp_path):
    data_file = tmp_path / "abs.csv"
    data_file.write_text("text,label\nx,a\n")
    loaded = recipe_io.load(write(tmp_path / "r", MINIMAL), [f"data.train={data_file}"])
    assert loaded.resolve_path(loaded.recipe.data.train) == data_file


def test_pkg_paths_point_into_the_installed_package(tmp_path):
    import ortft

    package_dir = Path(ortft.__file__).resolve().parent
    resolved = recipe_io.resolve_input_path("pkg://ortft/recipe/schema.py", tmp_path)
    assert resolved.resolve() == package_dir / "recipe" / "schema.py"
    assert resolved.is_file()
    # and a recipe may use one for its data (checked to exist like any local path)
    loaded = recipe_io.load(write(tmp_path, MINIMAL), ["data.train=pkg://ortft/recipe/schema.py"])
    assert (
        loaded.resolve_path(loaded.recipe.data.train).resolve()
        == package_dir / "recipe" / "schema.py"
    )


def test_pkg_path_inside_a_package_that_lacks_the_file(tmp_path):
    err = load_error(write(tmp_path, MINIMAL), ["data.train=pkg://ortft/no_such_file.csv"])
    assert "data.train" in str(err) and "no_such_file.csv does not exist" in str(err)


@pytest.mark.parametrize("value", ["pkg://no_such_pkg/x", "pkg://not-an-identifier/x"])
def test_pkg_path_to_a_missing_package_is_a_clear_error(tmp_path, value):
    with pytest.raises(RecipeError) as info:
        recipe_io.resolve_input_path(value, tmp_path)
    assert "is not installed" in str(info.value)
    err = load_error(write(tmp_path, MINIMAL), [f"data.train={value}"])
    package = value.removeprefix("pkg://").split("/")[0]
    assert err.problems == [
        f"data.train: {value}: Python package '{package}' is not installed (run `make setup`)"
    ]


# --------------------------------------------------------------------------- round trip


def test_dump_round_trips_and_sha_is_stable(tmp_path):
    path = write(tmp_path, MINIMAL)
    a = recipe_io.load(path)
    b = recipe_io.load(path)
    assert a.sha256 == b.sha256
    assert recipe_io.load(path, ["training.seed=1"]).sha256 != a.sha256
    again = Recipe.model_validate(__import__("yaml").safe_load(recipe_io.dump(a.recipe)))
    assert again == a.recipe


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("training:\n  max_steps: 1\n  max_steps: 5\n")
    with pytest.raises(RecipeError, match=r"line 3.*duplicate key 'training.max_steps'"):
        recipe_io.load(path)


def test_whole_recipe_errors_have_no_doubled_prefix() -> None:
    data = {
        "model": {"name_or_path": "m"},
        "task": "causal-lm",
        "data": {"train": "x.txt"},
        "precision": "fp16",
        "hardware": {"device": "cpu"},
    }
    with pytest.raises(RecipeError) as info:
        recipe_io.load(None, data=data, check_files=False)
    assert str(info.value) == (
        "recipe: precision.dtype=fp16 needs CUDA: PyTorch has no fp16 training "
        "on cpu; use bf16 (backend.name=torch) or fp32"
    )


def test_ortmodule_settings_are_refused_where_they_would_do_nothing(tmp_path):
    path = write(tmp_path, MINIMAL)
    for backend in ("torch", "ort-ondevice"):
        err = load_error(path, [f"backend.name={backend}", "backend.save_onnx=true"])
        assert "backend.save_onnx" in str(err)
    recipe_io.load(path, ["backend.name=ort", "backend.save_onnx=true"])  # ORTModule's own
    recipe_io.load(path, ["backend.name=torch", "backend.save_onnx=false"])  # a default is fine
