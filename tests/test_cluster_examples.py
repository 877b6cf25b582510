"""The cluster launch files in examples/cluster/ are valid and run commands that exist: the SLURM
script passes `bash -n` and, run with stand-ins for srun and scontrol, launches torchrun with
arguments torchrun's own parser accepts and an `ortft train` that ortft's CLI accepts; the
Kubeflow PyTorchJob has the fields the training operator needs and the same two checks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from torch.distributed.run import get_args_parser
from typer.main import get_command

from ortft.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"


def check_launch(torchrun_args: list[str], nodes: int) -> list[str]:
    """torchrun's parser accepts the arguments, c10d on ``nodes`` nodes, then `-m ortft train`
    whose recipe exists and whose options ortft's CLI parses; returns the ortft arguments."""
    args = get_args_parser().parse_args(torchrun_args)
    assert args.nnodes == str(nodes)
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint and args.max_restarts >= 1
    assert args.module and args.training_script == "ortft"
    command, *rest = args.training_script_args
    assert command == "train"
    train = get_command(app).commands["train"]  # type: ignore[attr-defined]
    ctx = train.make_context("train", list(rest))  # an unknown option raises here
    assert (ROOT / ctx.params["recipe"]).is_file(), ctx.params["recipe"]
    assert "checkpoint.resume=auto" in ctx.params["overrides"]
    assert ctx.params["output_dir"] is not None
    return rest


def test_slurm_script_is_valid_bash() -> None:
    res = subprocess.run(["bash", "-n", str(CLUSTER / "slurm.sbatch")], capture_output=True)
    assert res.returncode == 0, res.stderr


def test_slurm_script_launches_one_torchrun_agent_per_node(tmp_path: Path) -> None:
    """srun and scontrol replaced by scripts: srun records its arguments, one per line."""
    bin_dir, record = tmp_path / "bin", tmp_path / "srun.args"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n'
        f'echo "$TORCH_DISABLE_SHARE_RDZV_TCP_STORE" > {record}.share\n'
    )
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\nnode-c\\n'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_JOB_NODELIST": "node-[a-c]",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NAME": "ortft",
        "SLURM_GPUS_ON_NODE": "4",
    }
    res = subprocess.run(
        ["bash", str(CLUSTER / "slurm.sbatch"), "recipes/ddp.yaml", "training.max_steps=10"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    argv = record.read_text().splitlines()
    python = argv.index(str(ROOT / ".venv" / "bin" / "python"))
    assert "--ntasks-per-node=1" in argv[:python]  # one agent per node
    assert argv[python + 1 : python + 3] == ["-m", "torch.distributed.run"]
    rest = check_launch(argv[python + 3 :], nodes=3)
    assert "training.max_steps=10" in rest
    assert rest[-2:] == ["--output-dir", str(ROOT / "runs" / "ortft-42")]
    assert "--nproc-per-node=4" in argv and "--rdzv-endpoint=node-a:29500" in argv
    # the agents hand each restarted round a fresh store (see tests/test_multinode.py)
    assert Path(f"{record}.share").read_text().strip() == "1"


def test_slurm_script_needs_a_recipe() -> None:
    res = subprocess.run(
        ["bash", str(CLUSTER / "slurm.sbatch")], capture_output=True, text=True, check=False
    )
    assert res.returncode != 0 and "usage: sbatch" in res.stderr


@pytest.fixture
def job() -> dict:
    return yaml.safe_load((CLUSTER / "pytorchjob.yaml").read_text())


def test_pytorchjob_has_what_the_training_operator_needs(job: dict) -> None:
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["metadata"]["name"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert set(specs) == {"Master", "Worker"} and specs["Master"]["replicas"] == 1
    nodes = sum(spec["replicas"] for spec in specs.values())
    for spec in specs.values():
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        pod = spec["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == "pytorch"]
        assert container["image"]
        assert container["command"] == ["python", "-m", "torch.distributed.run"]
        assert {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"} in container["env"]
        # Kubernetes expands $(VAR) from the container's environment (the operator sets these)
        args = [
            a.replace("$(MASTER_ADDR)", "ortft-ddp-master-0").replace("$(MASTER_PORT)", "23456")
            for a in container["args"]
        ]
        rest = check_launch(args, nodes=nodes)
        output_dir = rest[rest.index("--output-dir") + 1]
        # the run directory is on the shared volume every pod mounts
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        (name,) = [n for n, path in mounts.items() if output_dir.startswith(path + "/")]
        assert volumes[name]["persistentVolumeClaim"]["claimName"]
