"""Image processors: what an image task loads where a text task loads its tokenizer.

Always the PIL backend. transformers 5.24 picks torchvision's when torchvision is installed
(``backend=None``), whose resize differs from PIL's; training, ``ortft predict``, the saved
``final/`` and the exported ``preprocess.onnx`` must all see the same pixels, so ortft asks
for ``backend="pil"`` everywhere. A model built ``from_config`` gets a ViT-style processor
sized to its config's ``image_size`` (resize to height x width, bilinear; rescale 1/255;
normalise with mean = std = 0.5, ViT's defaults).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ortft.core.errors import InputError, first_line
from ortft.recipe.io import LoadedRecipe

FILE = "preprocessor_config.json"


def load(loaded: LoadedRecipe, source: str | None, saved_dir: Path | None) -> Any:
    """The image processor of ``saved_dir`` (a resumed run), of the model folder ``source``,
    or None where the model is built from a config (``for_config`` builds it then)."""
    folder = str(saved_dir) if saved_dir else source
    if folder is None:
        return None
    if Path(folder).is_dir() and not (Path(folder) / FILE).exists():
        field = "model.name_or_path" if not saved_dir else str(saved_dir)
        raise InputError(
            f"{field}: {folder} has no {FILE} (an image model needs its image processor)"
        )
    return from_folder(folder, trust_remote_code=loaded.recipe.model.trust_remote_code)


def from_folder(folder: str, trust_remote_code: bool = False) -> Any:
    """``AutoImageProcessor`` of ``folder`` on its PIL backend."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(
            folder, backend="pil", trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = first_line(err)
        raise InputError(f"{folder}: cannot load the image processor ({first})") from None


def for_config(config: Any) -> Any:
    """A processor for a model built from ``config``: its image_size, ViT's other defaults."""
    from transformers.models.vit import ViTImageProcessorPil

    size = getattr(config, "image_size", None)
    if isinstance(size, list | tuple):
        height, width = int(size[0]), int(size[-1])
    elif isinstance(size, int):
        height = width = size
    else:
        raise InputError(
            f"model.from_config: {type(config).__name__} has no image_size; set "
            "model.from_config.options.image_size"
        )
    return ViTImageProcessorPil(size={"height": height, "width": width})
