"""``make gpu-check``: verify the GPU path on a machine with an NVIDIA GPU and bring back numbers.

scripts/gpu-check.sh refuses on a machine without a GPU, runs ``make setup`` (the GPU profile:
nvidia-smi sees a GPU), then this. Every step runs in its own process and is recorded whatever
its outcome, so one failing step (a backend, a precision) does not hide the others:

1. ``ortft doctor --json``: every provider library resolves, the CUDA extensions are built.
2. allocator: torch_gpu_allocator (built from PyPI's CUDA 12.4 wheels, no nvcc) loads and its
   three addresses lie inside it; ORTModule's CUDA session is configured with them
   (``gpu_external_alloc`` / ``_free`` / ``_empty_cache``); ``torch.cuda.memory_allocated()``
   grows across an ORTModule forward, i.e. ORT's CUDA 11.8 provider really allocates through
   cu12.4 torch's caching allocator, the pairing no one has tested (docs/gpu.md, section 4).
3. interop: torch (CUDA 12.4) and onnxruntime-training (CUDA 11.8) in one process: a CUDA
   tensor through DLPack into an OrtValue and back (same pointer, same values), then ORTModule
   against PyTorch on a small MLP (outputs and gradients), which is what every ORTModule step
   does (docs/gpu.md says why this is the question that matters).
4. the GPU bench recipes: ort vs torch vs torch + torch.compile, in fp32, bf16 and fp16.
5. the optimizer: torch's fused AdamW vs foreach on both backends, plus adamw_ort_fused (ORT's
   FusedAdam) only where its fused_ops extension was built (it needs a CUDA 12 nvcc).
6. padding elimination (ORTModule's embedding sparsity, CUDA-only in ORT 1.19) on vs off.
7. the compiled route (``backend.compile: true``, bf16) and ``backend.name: auto`` choosing
   among ort, torch and torch compiled (``backend.compile: auto``, ``precision.dtype: auto``),
   each a training run whose summary.json is recorded.
8. with two GPUs or more: 2-process DDP (torchrun), ort and torch.

The results, with the machine's description, go to
``benchmarks/results/gpu-check-<gpu>-<time>.json``, rewritten after every step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ("bert-cls-gpu", "gpt2-clm-gpu")  # recipes/bench/<name>.yaml
DTYPES = ("fp32", "bf16", "fp16")
PY = sys.executable

ALLOCATOR = r"""
import json, torch
from ortft.env import cuda_extensions, extensions
from onnxruntime.training.ortmodule import ORTModule
from onnxruntime.training.ortmodule.torch_cpp_extensions import torch_gpu_allocator as ext
out = {"problems": cuda_extensions.inspect(__import__("pathlib").Path(ext.__file__))}
model = ORTModule(torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.GELU(),
                                      torch.nn.Linear(4096, 256)).cuda())
x = torch.randn(512, 256, device="cuda")
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
y = model(x)  # ORT's activations kept for backward: allocated through torch's allocator
torch.cuda.synchronize()
out["memory_allocated_before"], out["memory_allocated_after"] = before, torch.cuda.memory_allocated()
manager = model._torch_module._execution_manager(True)
session = manager._execution_agent._inference_session
options = session.get_provider_options().get("CUDAExecutionProvider", {})
expected = {"gpu_external_alloc": ext.gpu_caching_allocator_raw_alloc_address(),
            "gpu_external_free": ext.gpu_caching_allocator_raw_delete_address(),
            "gpu_external_empty_cache": ext.gpu_caching_allocator_empty_cache_address()}
out["provider_options"] = {k: options.get(k) for k in expected}
out["session_uses_torch_allocator"] = all(str(v) == str(options.get(k)) for k, v in expected.items())
y.sum().backward()
# the output alone is 512 x 256 floats; the kept activations are 512 x 4096 x 2 more
out["ok"] = (not out["problems"] and out["session_uses_torch_allocator"]
             and out["memory_allocated_after"] - before >= 512 * 4096 * 4)
print(json.dumps(out))
raise SystemExit(0 if out["ok"] else 1)
"""

INTEROP = r"""
import copy, json, torch
from onnxruntime.capi import _pybind_state as C
from onnxruntime.training.ortmodule import ORTModule
out = {}
t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
value = C.OrtValue.from_dlpack(torch.utils.dlpack.to_dlpack(t), False)
back = torch.utils.dlpack.from_dlpack(value.to_dlpack())
out["dlpack_same_pointer"] = back.data_ptr() == t.data_ptr()
out["dlpack_equal"] = bool(torch.equal(back, t))
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8)).cuda()
ort_model = ORTModule(copy.deepcopy(ref))
x = torch.randn(32, 64, device="cuda")
for model in (ref, ort_model):
    model(x).pow(2).mean().backward()
out["ortmodule_output_max_abs_diff"] = (ref(x) - ort_model(x)).abs().max().item()
out["ortmodule_grad_max_abs_diff"] = max(
    (a.grad - b.grad).abs().max().item()
    for a, b in zip(ref.parameters(), ort_model.parameters())
)
out["ok"] = (out["dlpack_same_pointer"] and out["dlpack_equal"]
             and out["ortmodule_output_max_abs_diff"] < 1e-4
             and out["ortmodule_grad_max_abs_diff"] < 1e-4)
print(json.dumps(out))
raise SystemExit(0 if out["ok"] else 1)
"""


def bench_cmd(recipe: Path, backends: str, steps: int, repeats: int) -> list[str]:
    warmup = max(4, steps // 5)  # torch.compile compiles in its first steps
    return [PY, "-m", "ortft", "bench", str(recipe), "--backends", backends,
            "--steps", str(steps + warmup), "--warmup", str(warmup),
            "--repeats", str(repeats), "--json"]  # fmt: skip


def fused_ops_built() -> bool:
    from ortft.env import extensions

    return extensions.built_file("fused_ops") is not None


def plan(
    n_gpus: int, steps: int, repeats: int, recipe_dir: Path, fused_ops: bool = False
) -> list[dict[str, Any]]:
    """Every step: a name and the command whose stdout (JSON where it prints JSON) is recorded.
    ``recipe_dir`` holds the precision variants that :func:`write_precision_recipes` wrote."""
    steps_out: list[dict[str, Any]] = [
        {"name": "doctor", "cmd": [PY, "-m", "ortft", "doctor", "--json"]},
        {"name": "allocator", "cmd": [PY, "-c", ALLOCATOR]},
        {"name": "interop", "cmd": [PY, "-c", INTEROP]},
    ]
    for name in RECIPES:
        for dtype in DTYPES:
            recipe = recipe_dir / f"{name}-{dtype}.yaml"
            backends = "ort,torch,torch-compile"
            steps_out.append(
                {"name": f"bench {name} {dtype}",
                 "cmd": bench_cmd(recipe, backends, steps, repeats)}
            )  # fmt: skip
    bert = recipe_dir / "bert-cls-gpu-fp32.yaml"
    fused = "ort,ort+optimizer.implementation=foreach,torch,torch+optimizer.implementation=foreach"
    if fused_ops:  # what the profile has: set-up does not build fused_ops (docs/gpu.md, 4)
        fused += ",ort+optimizer.name=adamw_ort_fused"
    steps_out.append({"name": "fused adam", "cmd": bench_cmd(bert, fused, steps, repeats)})
    # bert-cls-gpu pads every batch to 256 tokens (snippets of ~30): the case it is made for.
    padding = (
        "ort,ort+ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0,"
        "ort+backend.compute_optimizer=false,torch"
    )
    steps_out.append(
        {"name": "padding elimination", "cmd": bench_cmd(bert, padding, steps, repeats)}
    )
    # the compiled route through `ortft train` (inductor on CUDA, bf16 autocast), then the
    # auto probe among ort, torch eager and torch compiled at their native precisions: the
    # summary's backend.compile / backend.probe records come back
    routes = {
        "compiled bf16": ["backend.name=torch", "backend.compile=true", "precision.dtype=bf16"],
        "auto routes": ["backend.name=auto", "backend.compile=auto", "precision.dtype=auto"],
    }
    plain = ROOT / "recipes" / "bench" / "bert-cls-gpu.yaml"  # no precision: set here
    for label, overrides in routes.items():
        train = [PY, "-m", "ortft", "train", str(plain), *overrides,
                 f"training.max_steps={steps * 10}", "--output-dir"]  # fmt: skip
        steps_out.append({"name": label, "cmd": train, "run_dir": True})
    if n_gpus >= 2:
        for backend in ("ort", "torch"):
            launcher = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
            train = ["-m", "ortft", "train", str(bert), f"backend.name={backend}",
                     f"training.max_steps={steps}", "--output-dir"]  # fmt: skip
            steps_out.append(
                {"name": f"ddp2 {backend}", "cmd": [*launcher, *train], "run_dir": True}
            )
    return steps_out


def write_precision_recipes(out_dir: Path) -> None:
    """recipes/bench/<name>.yaml with ``precision: <dtype>`` appended, one file per dtype (the
    bench compares backends; a precision is a recipe setting, so one bench per precision)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in RECIPES:
        text = (ROOT / "recipes" / "bench" / f"{name}.yaml").read_text()
        if re.search(r"^precision:", text, flags=re.M):
            raise SystemExit(f"recipes/bench/{name}.yaml sets precision: gpu_check sets it itself")
        for dtype in DTYPES:
            (out_dir / f"{name}-{dtype}.yaml").write_text(f"{text}\nprecision: {dtype}\n")


def machine() -> dict[str, Any]:
    query = "name,memory.total,driver_version,compute_cap,pcie.link.gen.max"
    smi = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    gpus = [dict(zip(query.split(","), (v.strip() for v in line.split(",")), strict=False))
            for line in smi.stdout.strip().splitlines()]  # fmt: skip
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False)
    versions = subprocess.run(
        [PY, "-c", "import json, torch, onnxruntime as o; from onnxruntime.capi import "
         "build_and_package_info as b; print(json.dumps({'torch': torch.__version__, "
         "'torch_cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(), "
         "'onnxruntime': o.__version__, 'ort_cuda': getattr(b, 'cuda_version', None)}))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return {
        "gpus": gpus,
        "topology": topo.stdout.strip() or None,
        "versions": _json_or_text(versions.stdout),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def _json_or_text(text: str) -> Any:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    for candidate in (text, lines[-1] if lines else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return text[-4000:]


def run_step(step: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    cmd = list(step["cmd"])
    if step.get("run_dir"):
        run_dir = work / step["name"].replace(" ", "-")
        cmd.append(str(run_dir))
    print(f"==> {step['name']}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"name": step["name"], "cmd": cmd, "exit_code": None, "timed_out": True}
    record: dict[str, Any] = {
        "name": step["name"], "cmd": cmd, "exit_code": proc.returncode,
        "seconds": round(time.monotonic() - start, 1), "result": _json_or_text(proc.stdout),
        "stderr_tail": proc.stderr[-3000:],
    }  # fmt: skip
    if step.get("run_dir") and (run_dir / "summary.json").is_file():
        record["summary"] = json.loads((run_dir / "summary.json").read_text())
    print(f"    exit {proc.returncode} in {record['seconds']} s", file=sys.stderr, flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per bench run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per backend, alternating")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds allowed per step")
    parser.add_argument("--out", type=Path, default=None, help="results JSON path")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import torch

    from ortft.core import fsutil

    n_gpus = torch.cuda.device_count()
    if n_gpus == 0:
        print("gpu-check: torch sees no CUDA GPU (torch.cuda.device_count() == 0)", file=sys.stderr)
        return 2
    desc = machine()
    slug = (
        re.sub(r"[^a-z0-9]+", "-", desc["gpus"][0]["name"].lower()).strip("-")
        if desc["gpus"]
        else "gpu"
    )
    out = (
        args.out
        or ROOT / "benchmarks" / "results" / f"gpu-check-{slug}-{time.strftime('%Y%m%d-%H%M')}.json"
    )
    report: dict[str, Any] = {"machine": desc, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "args": vars(args) | {"out": str(out)}, "steps": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ortft-gpu-check-") as tmp:
        work = Path(tmp)
        write_precision_recipes(work / "recipes")
        for step in plan(n_gpus, args.steps, args.repeats, work / "recipes", fused_ops_built()):
            report["steps"].append(run_step(step, work, args.timeout))
            fsutil.write_json_atomic(out, report)
    failed = [s["name"] for s in report["steps"] if s.get("exit_code") != 0]
    print(f"gpu-check: {len(report['steps'])} steps, failed: {', '.join(failed) or 'none'}; {out}",
          file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
