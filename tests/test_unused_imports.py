"""A run without DeepSpeed does not import it (ortft.env.unused): accelerate's unwrap in every
``save_pretrained`` and ORTModule's own import would, at seconds of CPU per process. After the
run the process sees DeepSpeed again, accelerate's helpers for it included, which transformers'
``Trainer`` imports."""

from __future__ import annotations

import sys
from pathlib import Path

from helpers import run_cli

from ortft.env import unused

# ortft's main, then which of these modules the process imported, on stderr
_TRAIN_THEN_LIST = (
    "import sys; sys.argv = ['ortft', *sys.argv[1:]]\n"
    "from ortft.cli.app import main\n"
    "try:\n    main()\nfinally:\n"
    "    seen = [m for m in ('deepspeed', 'mlflow') if sys.modules.get(m) is not None]\n"
    "    print('IMPORTED', *seen, file=sys.stderr)\n"
    "    import transformers.trainer  # imports accelerate's DeepSpeedSchedulerWrapper\n"
    "    print('TRAINER', file=sys.stderr)\n"
)


def test_a_run_without_deepspeed_imports_neither_it_nor_mlflow(
    cls_recipe: Path, tmp_path: Path
) -> None:
    """Train (checkpoint, final/, the export with ORT's parity), then eval: a fresh process."""
    run = tmp_path / "run"
    args = ["training.max_steps=2", "checkpoint.save_every=1", "--output-dir", str(run)]
    res = run_cli("train", cls_recipe, *args, code=_TRAIN_THEN_LIST, env={"NO_COLOR": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run / "onnx" / "model.onnx").is_file() and (run / "step-000001").is_dir()
    assert res.stderr.splitlines()[-2:] == ["IMPORTED", "TRAINER"], res.stderr[-2000:]


def test_the_scope_hides_deepspeed_and_gives_it_back() -> None:
    import importlib.util

    before = sys.modules.get(unused.DEEPSPEED, "absent")
    with unused.without_deepspeed(needed=True):
        assert sys.modules.get(unused.DEEPSPEED, "absent") is before
    with unused.without_deepspeed():
        if before == "absent":  # not imported yet in this process: hidden
            assert importlib.util.find_spec(unused.DEEPSPEED) is None
    assert sys.modules.get(unused.DEEPSPEED, "absent") is before
