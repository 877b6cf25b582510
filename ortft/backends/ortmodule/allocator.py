"""Where ORT's CUDA provider allocates under ORTModule: ``backend.gpu_allocator``.

onnxruntime 1.19.2 builds ``_RuntimeOptions`` inside every ``ORTModule(model)`` constructor
(``_graph_execution_manager.py``), with ``use_external_gpu_allocator = True`` (``options.py``;
no environment variable, only the experimental JSON key ``UseExternalGPUAllocator``, applied
after construction). On a GPU that constructor then imports the ``torch_gpu_allocator``
extension, and ``_utils.reinitialize_graph_execution_manager`` does again. So the switch acts
on the class's default, before construction, never on a built session:

- ``torch`` (the default, ORTModule's own): ORT allocates through torch's caching allocator,
  so the two share one pool; needs the extension (``ortft.env.cuda_extensions``).
- ``ort``: ORT's BFC arena beside torch's pool. Memory one frees is not reusable by the other,
  so peak memory can grow by up to the larger of the two working sets (docs/gpu.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from ortft.core.errors import BackendError, first_line

MODULE = "onnxruntime.training.ortmodule.torch_cpp_extensions.torch_gpu_allocator"


def configure(choice: str, cuda: bool) -> list[str]:
    """Apply ``backend.gpu_allocator`` to every ORTModule built from now on, and check that what
    it needs is there; returns the notes for the run's backend report."""
    from onnxruntime.training.ortmodule import options

    use_torch = choice == "torch"
    cls: Any = options._RuntimeOptions
    original = getattr(cls.__init__, "_ortft_original", cls.__init__)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.use_external_gpu_allocator = use_torch

    init._ortft_original = original  # type: ignore[attr-defined]
    cls.__init__ = init
    if not cuda:
        return []  # ORT's CPU provider allocates with its own allocator either way
    if use_torch:
        try:
            importlib.import_module(MODULE)
        except Exception as err:  # noqa: BLE001 - ImportError, or an OSError from the loader
            raise BackendError(
                "ORTModule on a GPU allocates through torch's caching allocator, and the "
                f"torch_gpu_allocator extension does not load ({type(err).__name__}: "
                f"{first_line(err, 200)}); run `ortft doctor --fix` (or "
                "`make setup`), or set backend.gpu_allocator=ort (ORT's own arena)"
            ) from None
        return ["gpu_allocator=torch (ORT allocates through torch's caching allocator)"]
    return ["gpu_allocator=ort (ORT's BFC arena beside torch's pool)"]
