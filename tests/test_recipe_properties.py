"""Property-based tests (hypothesis) on recipe loading and dotted overrides.

- any dotted key with a scalar value lands at exactly that place, parsed as a YAML scalar;
- overrides of valid recipe fields reach the validated recipe unchanged;
- junk overrides, junk YAML text and arbitrary YAML mappings never raise anything but
  RecipeError / UsageError (one readable message, exit 2), i.e. never a traceback.
"""

from __future__ import annotations

import math
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ortft.core.errors import EXIT_USAGE, OrtftError, RecipeError, UsageError
from ortft.recipe import io as recipe_io

MINIMAL = {
    "model": {
        "from_config": {"architecture": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2},
        "tokenizer": {"train": {"kind": "wordpiece", "vocab_size": 200}},
    },
    "task": "sequence-classification",
    "data": {"train": "train.csv"},
}

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("props")
    (folder / "train.csv").write_text("text,label\nhello,a\n")
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(MINIMAL))
    return path


# keys: what a user could type between dots (no '=', no '.', not empty)
key_part = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
dotted_key = st.lists(key_part, min_size=1, max_size=4)


def _scalar_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


scalars = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(alphabet=string.ascii_letters + " _-/", min_size=1, max_size=20),
)


@SETTINGS
@given(parts=dotted_key, value=scalars)
def test_an_override_lands_at_its_dotted_place(parts: list[str], value: object) -> None:
    text = _scalar_text(value)
    assume(yaml.safe_load(text) == value)  # e.g. "yes" or "1e3" read back as other types
    data = recipe_io.apply_overrides({}, [".".join(parts) + "=" + text])
    node = data
    for part in parts[:-1]:
        assert list(node) == [part]
        node = node[part]
    assert node == {parts[-1]: value}
    got = node[parts[-1]]
    assert type(got) is type(value) and (
        got == value or (isinstance(got, float) and math.isnan(got))
    )


@SETTINGS
@given(parts=dotted_key, rest=st.text(max_size=30))
def test_only_the_first_equals_sign_splits(parts: list[str], rest: str) -> None:
    value = "a=" + rest
    data = recipe_io.apply_overrides({}, [".".join(parts) + "=" + value])
    node = data
    for part in parts[:-1]:
        node = node[part]
    assert parts[-1] in node  # whatever YAML makes of the value, it is stored at that key


@SETTINGS
@given(parts=dotted_key, first=st.integers(), second=st.integers())
def test_later_overrides_win_and_siblings_stay(parts: list[str], first: int, second: int) -> None:
    key = ".".join(parts)
    sibling = [*parts[:-1], parts[-1] + "_x"]
    data = recipe_io.apply_overrides(
        {}, [f"{key}={first}", ".".join(sibling) + "=1", f"{key}={second}"]
    )
    node = data
    for part in parts[:-1]:
        node = node[part]
    assert node[parts[-1]] == second and node[sibling[-1]] == 1


valid_fields = st.one_of(
    st.tuples(st.just("training.max_steps"), st.integers(min_value=1, max_value=10**9)),
    st.tuples(st.just("training.seed"), st.integers(min_value=-(2**31), max_value=2**31)),
    st.tuples(st.just("training.lr"), st.floats(min_value=1e-9, max_value=0.99)),
    st.tuples(st.just("data.shuffle"), st.booleans()),
    # up to the base recipe's bert position table (512): longer is a recipe error (rules.positions)
    st.tuples(st.just("data.max_length"), st.integers(min_value=8, max_value=512)),
    st.tuples(st.just("backend.name"), st.sampled_from(["ort", "torch"])),
    st.tuples(st.just("checkpoint.keep_last"), st.integers(min_value=1, max_value=1000)),
    st.tuples(st.just("model.trust_remote_code"), st.booleans()),
    st.tuples(st.just("model.from_config.num_layers"), st.integers(min_value=1, max_value=64)),
)


@SETTINGS
@given(items=st.lists(valid_fields, min_size=1, max_size=5))
def test_valid_overrides_reach_the_validated_recipe(recipe_path: Path, items: list) -> None:
    loaded = recipe_io.load(recipe_path, [f"{k}={_scalar_text(v)}" for k, v in items])
    final = dict(items)  # the last override of a key wins
    for key, value in final.items():
        obj = loaded.recipe
        for part in key.split("."):
            obj = getattr(obj, part)
        assert obj == pytest.approx(value) if isinstance(value, float) else obj == value


def _load_or_user_error(path: Path | None, overrides: list[str], data: dict | None = None) -> None:
    try:
        recipe_io.load(path, overrides, data=data)
    except (RecipeError, UsageError) as err:
        assert err.exit_code == EXIT_USAGE
        assert str(err).strip(), "an error must say something"
    except OrtftError as err:  # pragma: no cover - would be a wrong error class
        pytest.fail(f"{type(err).__name__} for a recipe mistake: {err}")


junk = st.text(max_size=40)
junk_override = st.one_of(
    junk,
    st.builds(lambda k, v: f"{k}={v}", junk, junk),
    st.builds(lambda k, v: f"{'.'.join(k)}={v}", dotted_key, junk),
    st.builds(
        lambda s, v: f"{s}={v}",
        st.sampled_from(
            [
                "training.max_steps",
                "data.train",
                "model.name_or_path",
                "task",
                "backend",
                "checkpoint.resume",
                "data.label_names",
                "model",
                "training",
            ]
        ),
        junk,
    ),
)


@SETTINGS
@given(overrides=st.lists(junk_override, max_size=4))
def test_junk_overrides_are_only_ever_user_errors(recipe_path: Path, overrides: list[str]) -> None:
    _load_or_user_error(recipe_path, overrides)


yaml_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=15)
)
yaml_value = st.recursive(
    yaml_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
section_names = st.sampled_from(
    [
        "model",
        "task",
        "data",
        "training",
        "optimizer",
        "precision",
        "hardware",
        "deepspeed",
        "backend",
        "checkpoint",
        "export",
    ]
)


@SETTINGS
@given(
    mapping=st.dictionaries(st.one_of(section_names, st.text(max_size=10)), yaml_value, max_size=6)
)
@example(mapping={"function-": None})  # a key like pydantic's validator steps (found once)
def test_arbitrary_yaml_mappings_are_only_ever_user_errors(tmp_path: Path, mapping: dict) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(mapping))
    _load_or_user_error(path, [])


@SETTINGS
@given(changes=st.dictionaries(section_names, yaml_value, max_size=3))
def test_a_valid_recipe_with_arbitrary_sections_replaced(tmp_path: Path, changes: dict) -> None:
    (tmp_path / "train.csv").write_text("text,label\nhello,a\n")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, **changes}))
    _load_or_user_error(path, [])


@SETTINGS
@given(text=st.text(max_size=200))
def test_arbitrary_text_as_a_recipe_file_is_only_ever_a_user_error(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _load_or_user_error(path, [])
