"""preprocess.onnx: an image classifier's preprocessing as an ONNX graph, so that a client with
only onnxruntime, numpy and an image decoder feeds raw decoded pixels (uint8 [height, width, 3],
RGB, any size) and gets the ``pixel_values`` of transformers' PIL-backend image processor.

What that processor does (transformers 5.24, ``PilBackend``), and how the graph does the same:

- **resize**: the uint8 image goes through ``PIL.Image.resize`` and back to uint8. PIL resamples
  in two separable passes, each with integer weights (double weights times 2**22, rounded)
  summed in integers and shifted back to uint8 (half up, clipped). The graph computes the same
  weights from the image size, in double as PIL does, and applies each pass as a double
  ``MatMul`` (exact: every sum is an integer under 2**53), in the order the installed Pillow
  runs them (``_pass_order``). ONNX ``Resize`` (``antialias=1``, float32), tried first, is off
  by one step on 0.2-0.9% of the values and up to two (13x9 -> 8x8 bilinear: 7.8% off, enough
  to flip a near tie). NEAREST is an affine map in PIL, sampling ``floor(s_k)``, ``s_0 = a/2,
  s_k = s_(k-1) + a``, ``a = in/out`` summed in double: a double ``CumSum`` and a ``Gather`` per
  axis (ONNX's nearest modes: 8.9% of 640x480 -> 224x224 off). LANCZOS, BOX, HAMMING: not built.
- **center crop** (and ConvNeXt's ``crop_pct`` crop): cut at ``(n - crop) // 2``, zero padding
  (the larger half before) when the image is smaller than the crop.
- **rescale + normalize**: after the resize every value is an integer 0..255, so both are a
  [3, 256] lookup table made by the processor's own ``rescale`` and ``normalize``.
- HWC -> CHW and a batch axis of 1.

Each pass is a dense [out, in] double matrix: 640x480 -> 224x224 in 50-95 ms, 4000x3000 in 1.4 s
(two busy cores; the processor: 15-30 ms, 0.4-0.6 s). Opset 18, IR 8: ORT 1.19 and 1.32 agree.

Over 450 lines: one graph builder whose passes mirror PIL's step by step; split, the
mirroring would be harder to check against PIL.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortft.core.errors import InputError

# Steps of the 0..255 pixel value (one step = rescale_factor / std in pixel_values) the graph
# may differ by. It redoes PIL's integer arithmetic: 0 steps on every image measured (the
# sweep, `.venv/bin/python tests/test_image_preprocess.py`: 1800 random sizes 1..260 px to
# 32x32, 224x224 and shortest_edge 40, random and smooth images, bilinear, bicubic, nearest;
# ONNX Runtime 1.19 and 1.32 alike). One step stays allowed for a weight that another build
# sums in another order and rounds the other way. A wrong pass order is off by up to 24 steps,
# a wrong rounding by one step on many values (caught by the tests, which ask for none off).
TOL_LSB = 1

_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}
_NOT_BUILT = {1: "LANCZOS", 4: "BOX", 5: "HAMMING", 6: "MKS2013", 7: "MKS2021"}
_SUPPORT = {2: 1.0, 3: 2.0}  # PIL's filter support: bilinear (triangle), bicubic (a = -0.5)
# The methods on the PIL path; a subclass that overrides one does something the graph may not.
_PIPELINE = (
    "preprocess",
    "_preprocess_image_like_inputs",
    "_prepare_image_like_inputs",
    "process_image",
    "convert_to_rgb",
    "_preprocess",
    "resize",
    "center_crop",
    "rescale",
    "normalize",
    "pad",
)
# Overrides read and reproduced: ConvNeXt's crop_pct resize; BEiT's label maps (images unchanged).
_KNOWN = {
    "ConvNextImageProcessorPil": {"resize", "_preprocess"},
    "BeitImageProcessorPil": {"preprocess", "_preprocess_image_like_inputs", "_preprocess"},
}
_STATS = ("image_mean", "image_std")
_WIDTH_FIRST = "width first (Pillow <= 12)"
_HEIGHT_IF = "height first when H - out_h > 2 (W - out_w), else width first (Pillow 13)"
_OPSET_IR = {18: 8, 19: 9, 20: 9, 21: 10}  # the lowest IR version for each opset ORT 1.19 runs
_Resize = tuple[str, Any] | None  # ("fixed", (h, w)) or ("shortest_edge", n)


@dataclass(frozen=True)
class _Plan:
    """What the processor does to one image, in the order it does it."""

    resize: _Resize
    resample: int  # PIL's number: 0 nearest, 2 bilinear, 3 bicubic
    crops: tuple[tuple[int, int], ...]  # (height, width), each a centre crop
    rescale: float | None
    mean: list[float] | None
    std: list[float] | None


def supported_problem(processor: Any) -> str | None:
    """None when ``build`` can express this processor, else a one-line reason naming the setting."""
    plan = _plan(processor)
    return plan if isinstance(plan, str) else None


def build(processor: Any, path: Path, opset: int = 18) -> dict[str, Any]:
    """Write preprocess.onnx to ``path``; return its description for export.json."""
    import onnx

    plan = _plan(processor)
    if isinstance(plan, str):
        raise InputError(f"preprocess.onnx: {plan}")
    if opset not in _OPSET_IR:
        raise InputError(f"preprocess.onnx: opset {opset} is not one of 18-21 (ORT 1.19 runs 21)")
    order = _pass_order() if plan.resize and plan.resample != 0 else "none"
    graph, out_hw = _graph(plan, _table(processor, plan), order)
    opsets = [onnx.helper.make_opsetid("", opset)]
    model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=_OPSET_IR[opset])
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return _describe(plan, order, out_hw, opset)


def check(path: Path, processor: Any, images: list[np.ndarray]) -> dict[str, Any]:
    """Run preprocess.onnx and the processor on each uint8 [h, w, 3] RGB image; compare."""
    import onnxruntime as ort
    from PIL import Image

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tol = _tolerance(_plan(processor))
    report: dict[str, Any] = {"images": len(images), "tolerance": tol, "passed": False}
    worst, total, count, off = 0.0, 0.0, 0, 0
    for i, img in enumerate(images):
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            got = f"{img.dtype} {list(img.shape)}"
            raise InputError(f"image {i}: expected uint8 [height, width, 3], got {got}")
        ref = processor(images=[Image.fromarray(img)], return_tensors="np")["pixel_values"]
        out = sess.run(None, {"image": img})[0]
        if out.shape != ref.shape:
            problem = f"image {i}: shape {list(out.shape)}, the processor's {list(ref.shape)}"
            return {**report, "max_abs_diff": None, "mean_abs_diff": None, "problem": problem}
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        worst, total = max(worst, float(diff.max())), total + float(diff.sum())
        count, off = count + diff.size, off + int((diff > 1e-6).sum())
    return {
        **report,
        "max_abs_diff": worst,
        "mean_abs_diff": total / max(count, 1),
        "values_off": off / max(count, 1),  # the fraction that differs at all
        "passed": worst <= tol,
    }


# --------------------------------------------------------------------------- reading the processor


def _plan(processor: Any) -> _Plan | str:
    """The processor's steps, or why the graph cannot do them."""
    name = type(processor).__name__
    if getattr(processor, "backend", None) != "pil":
        return f"{name} is not a PIL-backend image processor (load it with backend='pil')"
    for cls in type(processor).__mro__:
        if cls.__name__ in ("PilBackend", "BaseImageProcessor"):
            break
        own = set(vars(cls)) & set(_PIPELINE)
        if own - _KNOWN.get(cls.__name__, set()):
            methods = ", ".join(sorted(own))
            return f"{cls.__name__} overrides {methods}, which preprocess.onnx does not reproduce"
    if getattr(processor, "do_pad", None):
        return "do_pad=True (padding to the batch's largest image or pad_size) is not supported"
    resample = _resample_code(getattr(processor, "resample", None))
    if isinstance(resample, str):
        return resample
    steps = _geometry(processor, name)
    if isinstance(steps, str):
        return steps
    values = _values(processor)
    if isinstance(values, str):
        return values
    resize, crops = steps
    if resize and resample not in _FILTERS:
        filt = _NOT_BUILT.get(resample, resample)
        return f"resample={filt} is not supported (BILINEAR, BICUBIC and NEAREST are)"
    if resize and resample != 0 and _pass_order() == "unknown":
        return "this Pillow runs its two resize passes in an order preprocess.onnx does not know"
    return _Plan(resize, resample, crops, *values)


def _resample_code(value: Any) -> int | str:
    try:
        return 2 if value is None else int(value)  # None: PilBackend.resize's default
    except (TypeError, ValueError):
        return f"resample={value!r} is not a PIL resampling filter"


def _geometry(processor: Any, name: str) -> tuple[_Resize, tuple[tuple[int, int], ...]] | str:
    """(resize, crops), in the processor's order."""
    size = dict(processor.size or {}) if getattr(processor, "do_resize", False) else {}
    crops: list[tuple[int, int]] = []
    resize: _Resize = None
    if name == "ConvNextImageProcessorPil" and size:
        if set(size) != {"shortest_edge"}:
            return f"ConvNeXt size={size} needs shortest_edge alone"
        edge, pct = int(size["shortest_edge"]), getattr(processor, "crop_pct", None)
        if edge >= 384:  # ConvNeXt warps to a square from 384 up
            resize = ("fixed", (edge, edge))
        elif not pct:
            return f"ConvNeXt crop_pct={pct!r} is not usable with shortest_edge={edge} < 384"
        else:  # shortest edge to edge / crop_pct, then an (edge, edge) centre crop
            resize = ("shortest_edge", int(edge / pct))
            crops.append((edge, edge))
    elif set(size) == {"height", "width"}:
        resize = ("fixed", (int(size["height"]), int(size["width"])))
    elif set(size) == {"shortest_edge"}:
        resize = ("shortest_edge", int(size["shortest_edge"]))
    elif size:
        return f"size={size} is not supported (height and width, or shortest_edge alone)"
    if getattr(processor, "do_center_crop", False):
        crop = dict(processor.crop_size or {})
        if set(crop) != {"height", "width"}:
            return f"crop_size={crop} needs height and width"
        crops.append((int(crop["height"]), int(crop["width"])))
    return resize, tuple(crops)


def _values(processor: Any) -> tuple[float | None, list[float] | None, list[float] | None] | str:
    scale = float(processor.rescale_factor) if getattr(processor, "do_rescale", False) else None
    if not getattr(processor, "do_normalize", False):
        return scale, None, None
    mean, std = (np.asarray(getattr(processor, f), np.float64).reshape(-1) for f in _STATS)
    if mean.size not in (1, 3) or std.size not in (1, 3):
        return f"image_mean={mean.tolist()}, image_std={std.tolist()}: 1 or 3 channels needed"
    return scale, np.broadcast_to(mean, (3,)).tolist(), np.broadcast_to(std, (3,)).tolist()


def _table(processor: Any, plan: _Plan) -> np.ndarray:
    """[3, 256] float32: what the processor's own rescale and normalize make of each value."""
    out: np.ndarray = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()
    if plan.rescale is not None:
        out = processor.rescale(out, plan.rescale)
    if plan.mean is not None:
        out = processor.normalize(out, plan.mean, plan.std)
    return np.asarray(out, dtype=np.float32).reshape(3, 256)


def _tolerance(plan: _Plan | str) -> float:
    if isinstance(plan, str):
        raise InputError(f"preprocess.onnx: {plan}")
    step = (plan.rescale or 1.0) / (min(plan.std) if plan.std else 1.0)
    return TOL_LSB * step * (1 + 1e-6) + 1e-6  # float32 table values round either way


@functools.lru_cache(maxsize=1)
def _pass_order() -> str:
    """Which separable pass the installed Pillow runs first, told by two probes: width first
    always (Pillow <= 12's Resample.c), or the installed 13.0.0's rule, height first when
    ``H - oh > 2 (W - ow)`` (3577 random sizes, bilinear, bicubic and lanczos alike, 0
    exceptions; github.com/python-pillow/Pillow/pull/9549's rule, height first when only the
    height shrinks, is not what this build does)."""
    from PIL import Image

    def first(h: int, w: int, oh: int, ow: int) -> str:
        img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), np.uint8))
        size = functools.partial(Image.Image.resize, resample=Image.Resampling.BILINEAR)
        both = np.asarray(size(img, (ow, oh)))
        if np.array_equal(both, np.asarray(size(size(img, (ow, h)), (ow, oh)))):
            return "w"
        return "h" if np.array_equal(both, np.asarray(size(size(img, (w, oh)), (ow, oh)))) else "?"

    probes = first(171, 101, 143, 118) + first(97, 52, 15, 20)  # height-only shrink; both shrink
    return {"ww": _WIDTH_FIRST, "hh": _HEIGHT_IF}.get(probes, "unknown")


def _describe(plan: _Plan, order: str, out_hw: tuple[Any, Any], opset: int) -> dict[str, Any]:
    import PIL

    resize = None
    if plan.resize:
        kind, value = plan.resize
        size = {"height": value[0], "width": value[1]} if kind == "fixed" else {kind: value}
        interp = _FILTERS[plan.resample] + (", antialiased (PIL's filter)" if plan.resample else "")
        resize = {
            "size": size,
            "interpolation": interp,
            "pass_order": order,
            "pillow": PIL.__version__,
        }
    return {
        "input": "image: uint8 [height, width, 3] (RGB, any size)",
        "output": f"pixel_values: float32 [1, 3, {out_hw[0]}, {out_hw[1]}]",
        "resize": resize,
        "center_crop": [{"height": ch, "width": cw} for ch, cw in plan.crops],
        "rescale": plan.rescale,
        "mean": plan.mean,
        "std": plan.std,
        "tolerance": _tolerance(plan),
        "opset": opset,
        "ir_version": _OPSET_IR[opset],
    }


# --------------------------------------------------------------------------- the graph

_U8, _F32, _F64, _I64 = 2, 1, 11, 7  # onnx.TensorProto.UINT8, FLOAT, DOUBLE, INT64


class _Builder:
    """Appends nodes with unique output names; a float input becomes a double constant. All
    constants are the main graph's initializers, which an If branch sees from outside."""

    def __init__(self, parent: _Builder | None = None) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = parent.inits if parent else []
        self.count: list[int] = parent.count if parent else [0]

    def op(self, op_type: str, *inputs: str | float, out: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        names = [self.const(v, np.float64) if isinstance(v, float) else v for v in inputs]
        self.count[0] += 1
        name = out or f"{op_type}_{self.count[0]}"
        self.nodes.append(helper.make_node(op_type, names, [name], **attrs))
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        from onnx import numpy_helper

        name = f"const_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def branch(self, name: str, make: Any) -> Any:
        """An If branch: a subgraph whose one output, double [1, 3, ?, ?], is ``make(sub)``."""
        from onnx import helper

        sub = _Builder(self)
        info = helper.make_tensor_value_info(make(sub), _F64, [1, 3, None, None])
        return helper.make_graph(sub.nodes, name, [], [info])


def _graph(plan: _Plan, table: np.ndarray, order: str) -> tuple[Any, tuple[Any, Any]]:
    from onnx import helper

    g = _Builder()
    x = g.op("Unsqueeze", g.op("Transpose", "image", perm=[2, 0, 1]), g.const([0]))
    shape = g.op("Shape", "image")
    h, w = (g.op("Slice", shape, g.const([i]), g.const([i + 1])) for i in (0, 1))
    out_hw: tuple[Any, Any] = ("height", "width")
    if plan.resize:
        oh, ow, out_hw = _target(g, plan.resize, h, w)
        if plan.resample == 0:
            x = _nearest(g, _nearest(g, x, h, oh, axis=2), w, ow, axis=3)
        else:
            x = _two_pass(g, x, plan.resample, order, (h, w), (oh, ow))
        h, w = oh, ow
    x = g.op("Cast", x, to=_I64)
    for i, (ch, cw) in enumerate(plan.crops):
        x, out_hw = _center_crop(g, x, h, w, ch, cw), (ch, cw)
        if i + 1 < len(plan.crops):  # ConvNeXt's crop_pct crop, then do_center_crop's
            h, w = g.const([ch]), g.const([cw])
    index = g.op("Add", x, g.const(np.arange(3).reshape(1, 3, 1, 1) * 256))
    g.op("Gather", g.const(table.reshape(-1), np.float32), index, out="pixel_values", axis=0)
    graph = helper.make_graph(
        g.nodes,
        "preprocess",
        [helper.make_tensor_value_info("image", _U8, ["height", "width", 3])],
        [helper.make_tensor_value_info("pixel_values", _F32, [1, 3, *out_hw])],
        initializer=g.inits,
    )
    return graph, out_hw


def _target(g: _Builder, resize: tuple[str, Any], h: str, w: str) -> tuple[str, str, tuple]:
    """(out_h, out_w) as int64 [1] tensors, and the output's static dims where known."""
    kind, value = resize
    if kind == "fixed":
        return g.const([value[0]]), g.const([value[1]]), tuple(value)
    # transformers' get_resize_output_image_size: the short side becomes `value`, the long one
    # int(value * long / short), which integer division equals for sizes under 2**53
    edge, tall = g.const([value]), g.op("LessOrEqual", w, h)
    long_h, long_w = (g.op("Div", g.op("Mul", edge, a), b) for a, b in ((h, w), (w, h)))
    oh, ow = g.op("Where", tall, long_h, edge), g.op("Where", tall, edge, long_w)
    return oh, ow, ("resized_height", "resized_width")


def _arange(g: _Builder, n: str) -> str:
    """0..n-1, int64, for an int64 [1] ``n``."""
    return g.op("Range", g.const(0), g.op("Squeeze", n, g.const([0])), g.const(1))


def _nearest(g: _Builder, x: str, n: str, out: str, axis: int) -> str:
    """PIL's NEAREST along one axis: indices floor(s_k), s_0 = a/2, s_k = s_(k-1) + a, a = n/out,
    in double as ImagingScaleAffine adds them."""
    a = g.op("Div", g.op("Cast", n, to=_F64), g.op("Cast", out, to=_F64))
    rest = g.op("Expand", a, g.op("Sub", out, g.const([1])))
    steps = g.op("Concat", g.op("Mul", a, 0.5), rest, axis=0)
    index = g.op("Cast", g.op("Floor", g.op("CumSum", steps, g.const(0))), to=_I64)
    return g.op("Gather", x, index, axis=axis)


def _two_pass(
    g: _Builder, x: str, resample: int, order: str, hw: tuple[str, str], out: tuple[str, str]
) -> str:
    """PIL's two passes, each ``clip((sum + 2**21) >> 22, 0, 255)``, in Pillow's order."""
    (h, w), (oh, ow) = hw, out
    x = g.op("Cast", x, to=_F64)
    down = _weights(g, h, oh, resample)  # [oh, h]
    across = g.op("Transpose", _weights(g, w, ow, resample), perm=[1, 0])  # [w, ow]

    def to_uint8(b: _Builder, total: str) -> str:
        shifted = b.op("Floor", b.op("Div", b.op("Add", total, 2.0**21), 2.0**22))
        return b.op("Clip", shifted, 0.0, 255.0)

    def width_first(b: _Builder) -> str:
        return to_uint8(b, b.op("MatMul", down, to_uint8(b, b.op("MatMul", x, across))))

    def height_first(b: _Builder) -> str:
        return to_uint8(b, b.op("MatMul", to_uint8(b, b.op("MatMul", down, x)), across))

    if order == _WIDTH_FIRST:
        return width_first(g)
    more = g.op("Greater", g.op("Sub", h, oh), g.op("Mul", g.const([2]), g.op("Sub", w, ow)))
    cond = g.op("Squeeze", g.op("And", g.op("Less", oh, h), more), g.const([0]))  # see _pass_order
    then = g.branch("height_first", height_first)
    return g.op("If", cond, then_branch=then, else_branch=g.branch("width_first", width_first))


def _weights(g: _Builder, n: str, out: str, resample: int) -> str:
    """[out, n] double: PIL's precompute_coeffs then normalize_coeffs_8bpc for one axis, a row
    per output pixel (zeros outside its window), each in PIL's order of double operations."""
    scale = g.op("Div", g.op("Cast", n, to=_F64), g.op("Cast", out, to=_F64))
    wide = g.op("Max", scale, 1.0)  # filterscale
    support, inv = g.op("Mul", _SUPPORT[resample], wide), g.op("Div", 1.0, wide)
    center = g.op("Mul", g.op("Add", g.op("Cast", _arange(g, out), to=_F64), 0.5), scale)
    low = g.op("Cast", g.op("Add", g.op("Sub", center, support), 0.5), to=_I64)  # (int) truncates
    high = g.op("Cast", g.op("Add", g.op("Add", center, support), 0.5), to=_I64)
    col = g.op("Unsqueeze", _arange(g, n), g.const([0]))  # [1, n]
    first, end, center = (
        g.op("Unsqueeze", v, g.const([1]))
        for v in (  # [out, 1]
            g.op("Max", low, g.const(0)),
            g.op("Min", high, n),
            center,
        )
    )
    inside = g.op("And", g.op("GreaterOrEqual", col, first), g.op("Less", col, end))
    arg = g.op("Mul", g.op("Add", g.op("Sub", g.op("Cast", col, to=_F64), center), 0.5), inv)
    raw = g.op("Where", inside, _filter(g, arg, resample), 0.0)
    # ww: CumSum adds left to right as PIL's loop does (the zeros before the window add nothing)
    total = g.op("Gather", g.op("CumSum", raw, g.const(1)), g.op("Sub", n, g.const([1])), axis=1)
    total = g.op("Where", g.op("Equal", total, 0.0), 1.0, total)
    scaled = g.op("Mul", g.op("Div", raw, total), float(2**22))
    half = g.op("Where", g.op("Less", scaled, 0.0), -0.5, 0.5)  # (int)(±0.5 + w * 2**22)
    return g.op("Cast", g.op("Cast", g.op("Add", half, scaled), to=_I64), to=_F64)


def _filter(g: _Builder, arg: str, resample: int) -> str:
    """PIL's bilinear_filter or bicubic_filter (a = -0.5), the same double operations."""
    x = g.op("Abs", arg)
    if resample == 2:
        return g.op("Where", g.op("Less", x, 1.0), g.op("Sub", 1.0, x), 0.0)
    # ((a + 2) x - (a + 3)) x x + 1 below 1, (((x - 5) x + 8) x - 4) a below 2
    near = g.op("Add", g.op("Mul", g.op("Mul", g.op("Sub", g.op("Mul", 1.5, x), 2.5), x), x), 1.0)
    far = g.op("Sub", g.op("Mul", g.op("Add", g.op("Mul", g.op("Sub", x, 5.0), x), 8.0), x), 4.0)
    far = g.op("Where", g.op("Less", x, 2.0), g.op("Mul", far, -0.5), 0.0)
    return g.op("Where", g.op("Less", x, 1.0), near, far)


def _center_crop(g: _Builder, x: str, h: str, w: str, ch: int, cw: int) -> str:
    """transformers' center_crop: zero-pad (the larger half before) to at least the crop, then
    cut at (n - crop) // 2."""
    crop = g.const([ch, cw])
    hw = g.op("Concat", h, w, axis=0)
    short = g.op("Max", g.op("Sub", crop, hw), g.const([0, 0]))
    before = g.op("Div", g.op("Add", short, g.const([1, 1])), g.const([2, 2]))
    zeros = g.const([0, 0])
    pads = g.op("Concat", zeros, before, zeros, g.op("Sub", short, before), axis=0)
    x = g.op("Pad", x, pads, g.const(0))
    start = g.op("Div", g.op("Sub", g.op("Add", hw, short), crop), g.const([2, 2]))
    return g.op("Slice", x, start, g.op("Add", start, crop), g.const([2, 3]))
