"""The demo pipeline through `snakemake --profile profiles/slurm` on the one-machine cluster.

Every rule but the Snakefile's localrules becomes a Slurm job; its outputs must be the bytes of a
local `snakemake --cores 2` run's: every exported weight file, and every evaluation JSON the
manifest lists but for its measured fields (time, speed: `MEASURED_FIELDS`). The same commands
in other processes, started by other means, give the same bytes (docs/training.md,
Reproducibility).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT, make_workdir, subprocess_env

from mini_trainer.training.metrics import MEASURED_FIELDS
from slurm.common import snakemake_slurm

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),  # a local run, then the same through Slurm
    pytest.mark.skipif(
        not (REPO_ROOT / "Snakefile").exists(), reason="needs the pipeline (no Snakefile yet)"
    ),
]


# Two stages (stage 2 starts from stage 1's checkpoint, also across Slurm jobs), one method.
CONFIG = {
    "model": "demo",
    "stages": ["sort", "sort_desc"],
    # One rank per job (a job's cost is start-up); the rule's launch command for N ranks:
    # tests/test_pipeline_logic.py; 2 ranks per node under Slurm: test_training_slurm.py.
    "launch": {"nproc_per_node": 1, "nodes": 1, "gpus_per_node": 0},
    "training": {
        "batch_size": 16,
        "max_tokens_per_gpu": 2048,
        "training_mode": "step",
        "max_steps": 8,
        "num_warmup_steps": 2,
        "lr_scheduler": "cosine",
        "save_every_steps": 4,
        "save_dtype": "float32",
    },
    "methods": {"sft": {"learning_rates": [0.01]}},
}


def workdir(path: Path) -> Path:
    """A copy of the workflow with CONFIG as config/config.yaml."""
    return make_workdir(path, CONFIG)


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int) -> str:
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command[:6])}... failed:\n{output[-6000:]}"
    return output


def computed_outputs(folder: Path) -> dict[str, object]:
    """Relative path -> bytes of every exported weight file, and -> the evaluation without its
    measured fields for every eval JSON the manifest lists."""
    found: dict[str, object] = {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted((folder / "results" / "train").glob("**/final/*.safetensors"))
    }
    manifest = json.loads((folder / "results" / "manifest.json").read_text())
    for entry in manifest["entries"]:
        if entry["kind"] == "eval":
            result = json.loads((folder / entry["path"]).read_text())
            found[entry["path"]] = {k: v for k, v in result.items() if k not in MEASURED_FIELDS}
    return found


def test_pipeline_through_slurm_matches_a_local_run(slurm_cluster, tmp_path):
    # The local reference runs alongside the Slurm run, which spends most of its time waiting
    # for job starts and status checks (the executor's polling interval grows while no job ends).
    local = workdir(tmp_path / "local")
    with (tmp_path / "local.log").open("w") as local_log:
        local_run = subprocess.Popen(
            [sys.executable, "-m", "snakemake", "--cores", "2"], cwd=local,
            env=subprocess_env(), stdout=local_log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            remote = workdir(tmp_path / "slurm")
            env = slurm_cluster.env(subprocess_env())
            output = run(snakemake_slurm(timeout_s=1800), remote, env, timeout=1900)
            local_run.wait(timeout=1500)
        finally:
            if local_run.poll() is None:
                local_run.kill()
                local_run.wait()
    local_output = (tmp_path / "local.log").read_text()
    assert local_run.returncode == 0, f"the local run failed:\n{local_output[-6000:]}"

    # Every job but the localrules went through sbatch; the localrules did not.
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", output)
    local_jobs = re.findall(r"^localrule (\w+):", output, re.MULTILINE)
    remote_jobs = re.findall(r"^rule (\w+):", output, re.MULTILINE)
    assert len(submitted) == len(remote_jobs) > 0, output[-3000:]
    assert {"train", "evaluate"} <= set(remote_jobs)
    assert "manifest" in local_jobs and "manifest" not in remote_jobs

    assert (remote / "results" / "report" / "report.html").exists()
    got, want = computed_outputs(remote), computed_outputs(local)
    evaluations = [path for path in want if path.endswith(".json")]
    weights = [path for path in want if path.endswith(".safetensors")]
    assert len(evaluations) == 3 * len(CONFIG["stages"])  # base + 2 stages, on each task
    assert len(weights) == len(CONFIG["stages"])
    assert got.keys() == want.keys()
    for path in want:
        assert got[path] == want[path], path
