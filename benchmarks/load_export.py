"""Rank 0's host memory and time to load a checkpoint into FSDP2 shards and to export it again:
streaming (tensor by tensor, module by module) against the previous whole-model code.

Both sides run the same job under torchrun with 2 CPU ranks (gloo), each side in fresh
processes: build the model on the meta device, shard it (FSDP2), allocate the shards, load the
checkpoint, export a Hugging Face folder. Measured on rank 0 with the kernel's peak-RSS counter
(reset through /proc/self/clear_refs before each phase):
- load overhead = peak RSS during the load - RSS before it - rank 0's own fp32 shard (which
  any loader must fill), as a share of the model's fp32 size;
- export overhead = peak RSS during the export - RSS before it, same share.
Then it checks that the two sides' exports are byte-identical and equal the checkpoint.

    python benchmarks/load_export.py                      # ~1.1 GB fp32 random Llama, stored bf16
    python benchmarks/load_export.py --model DIR --save-dtype float32   # an existing folder
    python benchmarks/load_export.py --experts 8 --layers 4 --intermediate 2048   # a Mixtral

The adaptive-OSFT case (`--adaptive`) measures rank 0's host memory and time for the layer
importance of `--osft-rank-mode adaptive` the same way (growth of peak RSS over the RSS before,
as a share of the model's fp32 size), in one fresh process per side (the measurement runs on
rank 0 alone, before any collective): the previous whole-model forward against the
layer-by-layer streaming one, on a sample of random token ids; the importances must be equal.

    python benchmarks/load_export.py --adaptive --repeats 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # helpers.whole_model_importance, the reference


# ---------------------------------------------------------------- the previous code, verbatim


def legacy_load(wrapped, model_path, config, runtime):
    """Before: rank 0 loads the whole model in fp32 with from_pretrained, then broadcasts."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoModelForCausalLM

    from mini_trainer.distributed.runtime import broadcast_object

    state, buffers = {}, {}
    if runtime.is_main:
        model = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=torch.float32)
        state = {f"model.{key}": value for key, value in model.state_dict().items()}
        buffers = {f"model.{key}": value.clone() for key, value in model.named_buffers()}
    set_model_state_dict(
        wrapped, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    values = broadcast_object(buffers, runtime)
    for name, _ in list(wrapped.named_buffers()):
        owner_name, _, buffer_name = name.rpartition(".")
        wrapped.get_submodule(owner_name)._buffers[buffer_name] = values[name].to(runtime.device)


def legacy_export(wrapped, config, out: Path, dtype, runtime):
    """Before: gather the full state on rank 0, cast all of it, save_file per shard."""
    import torch.distributed as dist
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if runtime.is_main:
        out.mkdir(parents=True)
        weights = {k.removeprefix("model."): v.to(dtype).contiguous() for k, v in state.items()}
        if getattr(config, "tie_word_embeddings", False):
            weights.pop("lm_head.weight", None)
        split = split_torch_state_dict_into_shards(weights, max_shard_size=5 * 1024**3)
        for filename, keys in split.filename_to_tensors.items():
            save_file({k: weights[k] for k in keys}, out / filename, metadata={"format": "pt"})
        if split.is_sharded:
            index = {
                "metadata": {
                    "total_size": sum(t.numel() * t.element_size() for t in weights.values())
                },  # noqa: E501
                "weight_map": split.tensor_to_filename,
            }
            (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    dist.barrier()


def legacy_measure(model_dir: str, data_path: str, seed: int) -> list[float]:
    """Before: the whole fp32 model with from_pretrained, one forward per sample, hooks (the
    reference tests/test_osft_adaptive.py checks the streamed measure against)."""
    from helpers import whole_model_importance

    from mini_trainer.osft.adaptive import sample_inputs

    return whole_model_importance(model_dir, sample_inputs(Path(data_path), seed))


# ---------------------------------------------------------------- one side, under torchrun


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.models.export import export_hf_weights
    from mini_trainer.models.loading import load_sharded_weights
    from mini_trainer.training import packed_attention
    from mini_trainer.training.model_setup import CausalLMWithLoss, decoder_layers, load_config

    torch.set_num_threads(1)
    runtime = init_runtime()
    config = load_config(args.model, packed_attention.register())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    wrapped = CausalLMWithLoss(model, loss_fn=None)
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(wrapped)
    wrapped.to_empty(device="cpu")
    fp32_bytes = sum(p.numel() * 4 for p in wrapped.parameters())
    shard_bytes = sum(p.to_local().numel() * 4 for p in wrapped.parameters())
    dtype = getattr(torch, args.save_dtype)

    dist.barrier()
    before, started = rss_kib("VmRSS"), time.perf_counter()
    reset_peak()
    if args.side == "legacy":
        legacy_load(wrapped, args.model, config, runtime)
    else:
        load_sharded_weights(wrapped, args.model, lambda state: state, runtime)
    dist.barrier()
    load = {"s": time.perf_counter() - started, "peak_kib": rss_kib("VmHWM"), "before_kib": before}

    before, started = rss_kib("VmRSS"), time.perf_counter()
    reset_peak()
    out = Path(args.out)
    if args.side == "legacy":
        legacy_export(wrapped, config, out, dtype, runtime)
    else:
        if runtime.is_main:
            out.mkdir(parents=True)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        export_hf_weights(
            wrapped,
            out if runtime.is_main else None,
            dtype,
            runtime,
            lambda s: s,
            tied,
            5 * 1024**3,
        )
        dist.barrier()
    export = {
        "s": time.perf_counter() - started,
        "peak_kib": rss_kib("VmHWM"),
        "before_kib": before,
    }
    if runtime.is_main:
        buffers = {name: value.tolist() for name, value in wrapped.named_buffers()}
        Path(args.report).write_text(json.dumps({
            "fp32_bytes": fp32_bytes, "shard_bytes": shard_bytes, "load": load,
            "export": export, "buffers": buffers,
        }))  # fmt: skip
    shutdown()


def adaptive_worker(args) -> None:
    """One side of the adaptive case, in a fresh process (transformers' model code imported
    before the measurement on both sides)."""
    import helpers  # noqa: F401 (the reference's module, loaded on both sides alike)
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401

    from mini_trainer.osft.adaptive import measure

    torch.set_num_threads(1)
    before, started = rss_kib("VmRSS"), time.perf_counter()
    reset_peak()
    run = legacy_measure if args.side == "legacy" else measure
    importance = run(args.model, args.data, 0)
    phase = {"s": time.perf_counter() - started, "peak_kib": rss_kib("VmHWM"), "before_kib": before}
    Path(args.report).write_text(json.dumps({"measure": phase, "importance": importance}))


def run_adaptive(model: Path, data: Path, report: Path, side: str) -> dict:
    command = [
        sys.executable, __file__, "--adaptive-worker", "--side", side, "--model", str(model),
        "--data", str(data), "--report", str(report),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())


def adaptive_case(model: Path, tmp: Path, args) -> None:
    """Both sides `--repeats` times, interleaved; medians; the importances compared."""
    import random

    from mini_trainer.models.loading import checkpoint_tensors

    fp32 = sum(4 * math.prod(entry.shape) for entry in checkpoint_tensors(model).values())
    rng = random.Random(0)
    data = tmp / "data.jsonl"
    with open(data, "w") as handle:
        for _ in range(64):
            length = rng.randint(args.sample_tokens // 2, args.sample_tokens)
            ids = [rng.randrange(args.vocab) for _ in range(length)]
            handle.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    rows = {"legacy": [], "streaming": []}
    for _ in range(args.repeats):
        for side in rows:
            rows[side].append(run_adaptive(model, data, tmp / f"{side}.json", side))
    print(f"model: {fp32 / 1e9:.2f} GB in fp32; 16 samples of {args.sample_tokens // 2}-"
          f"{args.sample_tokens} tokens; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| side | measure s | peak growth | x fp32 |")
    print("| --- | ---: | ---: | ---: |")
    for side, results in rows.items():
        growth = sorted(_growth(r["measure"]) for r in results)
        seconds = sorted(r["measure"]["s"] for r in results)
        mid = len(results) // 2
        print(f"| {side} | {seconds[mid]:.1f} | {growth[mid] / 1e9:.2f} GB "
              f"| {growth[mid] / fp32:.2f} |")  # fmt: skip
    legacy, streaming = rows["legacy"][0]["importance"], rows["streaming"][0]["importance"]
    worst = max(abs(a - b) for a, b in zip(legacy, streaming, strict=True))
    print(f"importances: largest difference {worst:.2e} over {len(legacy)} layers")
    if worst > 1e-6:
        print("MISMATCH: the importances differ")
        sys.exit(1)


# ---------------------------------------------------------------- orchestration


def make_model(folder: Path, args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    sizes = dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64, tie_word_embeddings=False,
    )  # fmt: skip
    if args.experts:  # a Mixtral: its checkpoint holds one tensor per expert
        from transformers import MixtralConfig

        config = MixtralConfig(**sizes, num_local_experts=args.experts, num_experts_per_tok=2)
    else:
        config = LlamaConfig(**sizes)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.stored_dtype))
    model.save_pretrained(folder)


def run_side(side: str, model: Path, out: Path, report: Path, args) -> dict:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, "--worker", "--side", side, "--model", str(model), "--out", str(out),
        "--report", str(report), "--save-dtype", args.save_dtype,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())


def compare(
    model: Path, legacy: Path, streaming: Path, save_dtype: str, fused_legacy: bool = False
) -> list[str]:
    """Problems: files that differ between the sides, or weights unlike the checkpoint. With
    `fused_legacy` (a mixture of experts) the previous code wrote the model's fused layout, not
    the checkpoint's, so only the streaming export is compared, with the checkpoint."""
    import torch
    from safetensors.torch import load_file

    problems = []
    names = sorted(p.name for p in legacy.iterdir())
    if names != sorted(p.name for p in streaming.iterdir()):
        problems.append(
            f"file lists differ: {names} vs {sorted(p.name for p in streaming.iterdir())}"
        )
    for name in names if not fused_legacy else ():
        if (legacy / name).read_bytes() != (streaming / name).read_bytes():
            problems.append(f"{name}: not byte-identical")
    source = {}
    for path in sorted(model.glob("*.safetensors")):
        source.update(load_file(path))
    exported = {}
    for path in sorted(streaming.glob("*.safetensors")):
        exported.update(load_file(path))
    for key, value in source.items():
        expected = value.to(getattr(torch, save_dtype)).float().to(value.dtype)
        if key not in exported or not torch.equal(exported[key].to(value.dtype), expected):
            problems.append(f"{key}: exported weight differs from the checkpoint")
    return problems


def _growth(phase: dict) -> int:
    return (phase["peak_kib"] - phase["before_kib"]) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an existing HF folder (default: build a random Llama)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--experts", type=int, default=0, help="a Mixtral with this many experts")
    parser.add_argument("--stored-dtype", default="bfloat16")
    parser.add_argument("--save-dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--adaptive", action="store_true", help="the adaptive-OSFT case")
    parser.add_argument("--sample-tokens", type=int, default=256, help="longest sample (adaptive)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--adaptive-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=("legacy", "streaming"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.adaptive_worker:
        adaptive_worker(args)
        return

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        model = Path(args.model) if args.model else tmp / "model"
        if not args.model:
            started = time.perf_counter()
            make_model(model, args)
            print(f"random model written in {time.perf_counter() - started:.0f} s")
        if args.adaptive:
            adaptive_case(model, tmp, args)
            return
        results = {"legacy": [], "streaming": []}
        for repeat in range(args.repeats):
            for side in ("legacy", "streaming"):
                out = tmp / f"{side}-{repeat}"
                results[side].append(run_side(side, model, out, tmp / f"{side}.json", args))
        problems = compare(model, tmp / "legacy-0", tmp / "streaming-0", args.save_dtype,
                           fused_legacy=bool(args.experts))  # fmt: skip
        legacy_buffers = results["legacy"][0]["buffers"]
        if legacy_buffers != results["streaming"][0]["buffers"]:
            problems.append("non-persistent buffers differ between the sides")
    fp32 = results["legacy"][0]["fp32_bytes"]
    shard = results["legacy"][0]["shard_bytes"]
    print(f"model: {fp32 / 1e9:.2f} GB in fp32; rank 0's shard {shard / 1e9:.2f} GB; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| side | load s | load overhead | x fp32 | export s | export overhead | x fp32 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for side, rows in results.items():
        load = sorted(
            (r["load"]["peak_kib"] - r["load"]["before_kib"]) * 1024 - shard for r in rows
        )
        export = sorted((r["export"]["peak_kib"] - r["export"]["before_kib"]) * 1024 for r in rows)
        load_s = sorted(r["load"]["s"] for r in rows)
        export_s = sorted(r["export"]["s"] for r in rows)
        mid = len(rows) // 2
        print(
            f"| {side} | {load_s[mid]:.1f} | {load[mid] / 1e9:.2f} GB | {load[mid] / fp32:.2f} "
            f"| {export_s[mid]:.1f} | {export[mid] / 1e9:.2f} GB | {export[mid] / fp32:.2f} |"
        )
    for problem in problems:
        print("MISMATCH:", problem)
    if problems:
        sys.exit(1)
    if args.experts:
        print("streaming export equal to the checkpoint (its per-expert layout; the previous "
              "code wrote the fused layout), buffers equal")  # fmt: skip
    else:
        print("exports byte-identical, weights equal to the checkpoint, buffers equal")


if __name__ == "__main__":
    main()
