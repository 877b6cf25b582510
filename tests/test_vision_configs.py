"""model.from_config on vision types: the generic sizes derived onto stage lists
(hf_config.VISION), stochastic depth set by model.dropout in the field's own type, the
image_size option on configs without the field (resnet, regnet)."""

from __future__ import annotations

import pytest

from ortft.backends.torch import hf_config
from ortft.core.errors import RecipeError
from ortft.families.vision import processor as processors
from ortft.recipe.schema import FromConfig


def _config(arch: str, dropout: float | None = 0.0, **fields: object):
    return hf_config.generic_config(FromConfig(architecture=arch, **fields), None, dropout)


def test_stage_lists_follow_from_the_generic_sizes() -> None:
    swin = _config("swin", hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)
    assert (swin.embed_dim, swin.depths, swin.num_heads, swin.mlp_ratio) == (
        16,
        [2, 2],
        [2, 4],
        2.0,
    )
    convnext = _config("convnext", hidden_size=16, num_layers=3)
    assert (convnext.num_stages, convnext.hidden_sizes, convnext.depths) == (
        3,
        [16, 32, 64],
        [1, 1, 1],
    )
    resnet = _config("resnet", hidden_size=16, num_layers=2)
    assert (resnet.embedding_size, resnet.hidden_sizes, resnet.layer_type) == (
        16,
        [16, 32],
        "basic",
    )
    regnet = _config("regnet", hidden_size=16, num_layers=2, num_heads=2)
    assert (regnet.hidden_sizes, regnet.groups_width) == ([16, 32], 8)
    dinov2 = _config("dinov2", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    assert (dinov2.hidden_size, dinov2.num_hidden_layers, dinov2.mlp_ratio) == (32, 2, 2)


def test_a_size_the_type_does_not_use_is_an_error() -> None:
    with pytest.raises(RecipeError, match="intermediate_size: ResNetConfig has no such size"):
        _config("resnet", hidden_size=16, intermediate_size=64)
    with pytest.raises(RecipeError, match="whole multiple of hidden_size"):
        _config("dinov2", hidden_size=32, num_heads=2, intermediate_size=48)


def test_dropout_sets_stochastic_depth_in_the_fields_own_type() -> None:
    assert _config("beit", hidden_size=32).drop_path_rate == 0.0  # default 0.1
    assert _config("swin", hidden_size=16, dropout=0.2).drop_path_rate == 0.2
    assert _config("levit", hidden_size=16, num_heads=2, intermediate_size=32).drop_path_rate == 0
    # levit's is an int field: 0.1 cannot be set, its default (0) stays
    assert (
        _config("levit", 0.1, hidden_size=16, num_heads=2, intermediate_size=32).drop_path_rate == 0
    )


def test_image_size_reaches_the_processor_of_a_config_without_the_field() -> None:
    config = _config("resnet", hidden_size=16, options={"image_size": 24})
    assert processors.for_config(config).size == {"height": 24, "width": 24}
    with pytest.raises(RecipeError, match="options.image_size: BertConfig has no field"):
        _config("bert", hidden_size=32, options={"image_size": 24})
