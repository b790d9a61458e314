"""The plan's per-rank peak against the peak measured in real `mini_trainer.train` runs (CPU).

Measured: the run's steps execute inside torch's MemTracker (`MINI_TRAINER_MEMORY_PROBE`, see
mini_trainer/training/memory_probe.py): the peak of live tensor bytes on rank 0, parameters,
gradients, optimizer states, activations and temporaries together, which is what the plan
predicts with --device cpu (fp32, no allocator overhead). Each configuration trains 3 steps;
every row of the data has the same length, and a step gives each rank one packed row of exactly
T tokens.

    python benchmarks/plan.py [--configs NAME ...] [--out FILE.json]

Models: the demo model (`mini-trainer demo-assets`) and `llama-125m`, a 125M-parameter Llama
built here from a config (random weights, saved as safetensors).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SAMPLE_TOKENS = 128
CONFIGS = {
    # name: (model, ranks, T, activation checkpointing, OSFT unfreeze ratio or None[, flags])
    "demo-1r-T512": ("demo", 1, 512, False, None),
    "demo-1r-T256-ac": ("demo", 1, 256, True, None),
    "demo-2r-T512-osft": ("demo", 2, 512, False, 0.25),
    "demo-2r-T256-ac-osft": ("demo", 2, 256, True, 0.5),
    "125m-1r-T256": ("125m", 1, 256, False, None),
    "125m-2r-T512-ac": ("125m", 2, 512, True, None),
    "125m-2r-T256-osft": ("125m", 2, 256, False, 0.5),
    # a 6th element: the optimizer mode's flags (docs/training.md)
    "125m-1r-T256-bf16": ("125m", 1, 256, False, None, ("--optimizer", "adamw-bf16")),
    "125m-1r-T256-bf16-params": (
        "125m",
        1,
        256,
        False,
        None,
        ("--optimizer", "adamw-bf16", "--param-dtype", "bf16"),
    ),
    "125m-1r-T256-8bit": ("125m", 1, 256, False, None, ("--optimizer", "adamw-8bit")),
    "125m-1r-T256-8bit-bf16-params": (
        "125m",
        1,
        256,
        False,
        None,
        ("--optimizer", "adamw-8bit", "--param-dtype", "bf16"),
    ),
}
LLAMA_125M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "use_cache": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def child_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    return env


def make_models(work: Path) -> dict[str, Path]:
    """The demo model and the 125M Llama, built locally (nothing downloaded)."""
    demo = work / "demo"
    if not (demo / "model").is_dir():
        subprocess.run(
            [sys.executable, "-m", "mini_trainer", "demo-assets", "--out", str(demo)],
            check=True,
            env=child_env(),
            capture_output=True,
        )
    big = work / "llama-125m"
    if not (big / "model.safetensors").is_file():
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA_125M), dtype=torch.float32)
        model.save_pretrained(big)
    return {"demo": demo / "model", "125m": big}


def make_data(work: Path, vocab: int, samples: int) -> Path:
    path = work / f"rows-{vocab}.jsonl"
    if not path.is_file():
        rng = random.Random(0)
        with open(path, "w") as out:
            for _ in range(samples):
                ids = [rng.randrange(3, vocab) for _ in range(SAMPLE_TOKENS)]
                out.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    return path


def training_flags(
    model: Path, ranks: int, tokens: int, ac: bool, osft: float | None, extra: tuple = ()
) -> list[str]:
    flags = [
        "--max-tokens-per-gpu",
        str(tokens),
        "--batch-size",
        str(ranks * tokens // SAMPLE_TOKENS),
    ]
    if ac:
        flags.append("--activation-checkpointing")
    if osft is not None:
        flags += ["--osft", "--osft-unfreeze-rank-ratio", str(osft)]
    return [*flags, *extra]


def measure(model: Path, data: Path, flags: list[str], ranks: int, work: Path, name: str) -> dict:
    out, probe = work / f"run-{name}", work / f"probe-{name}"
    shutil.rmtree(out, ignore_errors=True)  # a rerun measures afresh
    train = [
        "-m",
        "mini_trainer.train",
        "--model-name-or-path",
        str(model),
        "--data-path",
        str(data),
        "--output-dir",
        str(out),
        "--max-steps",
        "3",
        "--training-mode",
        "step",
        *flags,
    ]
    head = (
        [sys.executable]
        if ranks == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
        ]
    )
    started = time.perf_counter()
    done = subprocess.run(
        [*head, *train],
        # Every allocation over 64 KiB its own mapping: the probe's resident-memory measure of
        # torchao's compiled 8-bit step then sees each temporary come and go.
        env=child_env()
        | {"MINI_TRAINER_MEMORY_PROBE": str(probe), "MALLOC_MMAP_THRESHOLD_": "65536"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode:
        raise SystemExit(f"{name}: training failed\n{done.stderr[-3000:]}")
    snapshot = json.loads(Path(f"{probe}.rank0.json").read_text())["cpu"]
    return {
        "peak": snapshot["Total"],
        "breakdown": snapshot,
        "seconds": time.perf_counter() - started,
    }


def predict(model: Path, ranks: int, flags: list[str]) -> dict:
    from mini_trainer.plan.inputs import Cluster, make_plan

    cluster = Cluster(nodes=1, gpus_per_node=ranks, gpu_memory_gib=16, device="cpu")
    plan = make_plan(str(model), None, cluster, flags)
    return {
        "peak": plan["per_gpu"]["peak_bytes"],
        "phase": plan["per_gpu"]["peak_phase"],
        "seconds": plan["plan_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--work", type=Path, default=None, help="Keep models and data here.")
    parser.add_argument("--out", type=Path, default=None, help="Write the rows as JSON too.")
    options = parser.parse_args()
    work = options.work or Path(tempfile.mkdtemp(prefix="plan-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    models = make_models(work)
    rows = []
    print(f"{'config':24s} {'measured MiB':>12s} {'plan MiB':>10s} {'plan/measured':>13s}  phase")
    for name in options.configs:
        kind, ranks, tokens, ac, osft, *extra = CONFIGS[name]
        vocab = json.loads((models[kind] / "config.json").read_text())["vocab_size"]
        data = make_data(work, vocab, 256)
        flags = training_flags(models[kind], ranks, tokens, ac, osft, *extra)
        measured = measure(models[kind], data, flags, ranks, work, name)
        planned = predict(models[kind], ranks, flags)
        ratio = planned["peak"] / measured["peak"]
        rows.append({"config": name, "measured": measured, "plan": planned, "ratio": ratio})
        print(
            f"{name:24s} {measured['peak'] / 2**20:12.1f} {planned['peak'] / 2**20:10.1f} "
            f"{ratio:13.3f}  {planned['phase']}",
            flush=True,
        )
    worst = max(abs(row["ratio"] - 1) for row in rows)
    print(f"worst |plan/measured - 1|: {worst:.1%} (goal <= 15%); load average {os.getloadavg()}")
    if options.out:
        options.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
