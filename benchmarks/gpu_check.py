"""The Python parts of `benchmarks/gpu_check.sh` (see there); each writes one JSON file.

    python benchmarks/gpu_check.py attention  --out F.json [--cpu-dry-run]
    python benchmarks/gpu_check.py families   --out F.json [--cpu-dry-run]
    python benchmarks/gpu_check.py throughput --out F.json [--cpu-dry-run]
    python benchmarks/gpu_check.py training   --out F.json --run DIR      (metrics.jsonl summary)
    python benchmarks/gpu_check.py summarize  --out F.json --parts DIR    (one JSON, one table)

On the CPU (`--cpu-dry-run`) every part runs at tiny sizes in fp32 with the paths that exist
there (per-sample sdpa, the reference varlen kernel): it checks the script, not the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mini_trainer.batching.collator import collate_packed, count_loss_tokens  # noqa: E402
from mini_trainer.training import attention  # noqa: E402
from mini_trainer.training.flops import ModelFlops  # noqa: E402
from mini_trainer.training.loss import chunked_linear_cross_entropy  # noqa: E402
from mini_trainer.training.model_setup import CausalLMWithLoss  # noqa: E402


def device_and_dtype(dry_run: bool):
    if dry_run or not torch.cuda.is_available():
        return torch.device("cpu"), torch.float32
    return torch.device("cuda"), torch.bfloat16


# Kept alike on purpose: keyword calls (LlamaConfig here, lm-eval elsewhere) share a shape.
def llama(hidden, layers, heads, kv_heads, intermediate, vocab, name, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        use_cache=False,
        max_position_embeddings=16384,
    )
    config._attn_implementation = name
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).to(dtype)


def available_paths(device) -> list[str]:
    """Every packed-attention path this machine can run."""
    paths = [attention.register(attention.PER_SAMPLE_NAME)]
    if device.type == "cuda":
        if attention.torch_varlen_available():
            paths.append(attention.register(attention.VARLEN_NAME))
        if attention.flash_attn_imports()[0]:
            paths.append(attention.FLASH_NAME)
    else:
        reference = "mini_trainer_reference_varlen"
        paths.append(attention.register_varlen(reference, attention.reference_varlen_kernel))
    return paths


def random_samples(count, median, cap, vocab, seed=0) -> list[dict]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(math.log(median), 0.8, count).astype(int), 8, cap)
    samples = []
    for n in lengths:
        ids = rng.integers(3, vocab, n).tolist()
        cut = n // 3  # a prompt without loss, an answer with loss
        samples.append({"input_ids": ids, "labels": [-100] * cut + ids[cut:]})
    return samples


def check_attention(args) -> dict:
    """packed == each sample alone, per path, and the time of one packed forward+backward."""
    device, dtype = device_and_dtype(args.cpu_dry_run)
    small = dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=300)
    reference = CausalLMWithLoss(
        llama(**small, name="eager", device=device, dtype=torch.float32),
        chunked_linear_cross_entropy,
    )
    samples = random_samples(6, 40, 120, 300, seed=1)
    expected = sum(reference(*_row(collate_packed([s], 1), device)[:3]) for s in samples).item()
    dry = args.cpu_dry_run
    timing = random_samples(4 if dry else 128, 60 if dry else 1000, 256 if dry else 8192, 300, 2)
    results = {}
    for name in available_paths(device):
        model = CausalLMWithLoss(
            llama(**small, name=name, device=device, dtype=dtype), chunked_linear_cross_entropy
        )
        model.load_state_dict(reference.state_dict())
        model.to(dtype)
        micro = collate_packed(samples, 1).to(device)
        got = model(
            micro.input_ids,
            micro.position_ids,
            micro.target_ids,
            loss_rows=micro.loss_rows,
            **attention.attention_kwargs(name, micro),
        ).item()
        rel = abs(got - expected) / abs(expected)
        big = collate_packed(timing, 1).to(device)
        seconds = _timed(
            lambda m=model, b=big, n=name: m(
                b.input_ids,
                b.position_ids,
                b.target_ids,
                loss_rows=b.loss_rows,
                **attention.attention_kwargs(n, b),
            ).backward(),
            device,
            repeats=1 if dry else 3,
        )
        results[name] = {
            "packed_loss": got,
            "alone_loss": expected,
            "rel_diff": rel,
            "ok": rel < (1e-5 if dtype == torch.float32 else 2e-2),
            "tokens": big.num_tokens,
            "fwd_bwd_s": seconds,
        }
    return {
        "device": str(device),
        "dtype": str(dtype),
        "paths": results,
        "ok": all(r["ok"] for r in results.values()),
    }


def check_families(args) -> dict:
    """Every supported family (tests/families.py's tiny models) on every attention kernel this
    machine has and the family's attention needs allow: the packed row's summed loss against
    the fp32 eager per-sample reference (bf16 on a GPU: agreement to bf16 rounding, 2e-2)."""
    sys.path.insert(0, str(REPO / "tests"))
    from families import FAMILIES, build_model, samples

    device, dtype = device_and_dtype(args.cpu_dry_run)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    results, ok = {}, True
    for family in FAMILIES:
        reference = build_model(family.name).to(device).eval()
        batch = samples(reference.config.vocab_size)
        with torch.no_grad():
            expected = sum(
                reference(
                    input_ids=torch.tensor([s["input_ids"]], device=device),
                    labels=torch.tensor([s["labels"]], device=device),
                    use_cache=False,
                ).loss.item()
                * sum(label != -100 for label in s["labels"][1:])
                for s in batch
            )
        needs = attention.attention_needs(reference)
        results[family.name] = {}
        for name in available_paths(device):
            # the CPU dry run's reference varlen kernel stands for torch's varlen kernel
            supported = attention.KERNEL_SUPPORTS.get(
                name, attention.KERNEL_SUPPORTS[attention.VARLEN_NAME]
            )
            if name != attention.PER_SAMPLE_NAME and not needs <= supported:
                continue  # choose_attention never gives this kernel to this family
            model = build_model(family.name).to(device, dtype).eval()
            model.set_attn_implementation(name)
            wrapped = CausalLMWithLoss(model, chunked_linear_cross_entropy)
            micro = collate_packed(batch, 1).to(device)
            with torch.no_grad():
                got = wrapped(
                    micro.input_ids, micro.position_ids, micro.target_ids,
                    loss_rows=micro.loss_rows, **attention.attention_kwargs(name, micro),
                ).item()  # fmt: skip
            rel = abs(got - expected) / abs(expected)
            results[family.name][name] = rel
            ok = ok and rel <= tolerance
    return {"ok": ok, "tolerance": tolerance, "dtype": str(dtype), "families": results}


def _row(micro, device):
    micro = micro.to(device)
    return micro.input_ids, micro.position_ids, micro.target_ids


def _timed(fn, device, repeats=3) -> float:
    fn()  # warm-up (kernels, autotuning)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def throughput(args) -> dict:
    """Random-init Llama (~1B on GPU), packed rows (the chosen attention) against padded."""
    device, dtype = device_and_dtype(args.cpu_dry_run)
    if args.cpu_dry_run:
        size = dict(hidden=64, layers=2, heads=4, kv_heads=4, intermediate=128, vocab=500)
        count, median, cap, per_micro, steps = 32, 60, 512, 4, 2
    else:  # ~1.1B parameters
        size = dict(hidden=2048, layers=16, heads=16, kv_heads=16, intermediate=5632, vocab=32000)
        count, median, cap, per_micro, steps = 64, 800, 16384, 4, 6
    packed_name = (
        attention.pick_attention(_Runtime(device))
        if device.type == "cuda"
        else (attention.register(attention.PER_SAMPLE_NAME))
    )
    results = {"device": _device_name(device), "dtype": str(dtype), "attention": packed_name}
    for side in ("padded", "packed"):
        # bf16 weights on the GPU (as FSDP2's bf16 compute), fp32 on the CPU.
        model = llama(
            **size, name="sdpa" if side == "padded" else packed_name, device=device, dtype=dtype
        )
        flops = ModelFlops.of(model, _device_name(device) if device.type == "cuda" else None)
        wrapped = CausalLMWithLoss(model, chunked_linear_cross_entropy).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
        tokens, squares, seconds = 0, 0, 0.0
        for step in range(steps + 1):  # step 0 warms up
            samples = random_samples(count, median, cap, size["vocab"], seed=step)
            started = _sync_time(device)
            if side == "packed":
                _packed_step(wrapped, samples, cap, packed_name, device)
            else:
                _padded_step(wrapped, samples, per_micro, device)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step:
                seconds += _sync_time(device) - started
                tokens += sum(len(s["input_ids"]) for s in samples)
                squares += sum(len(s["input_ids"]) ** 2 for s in samples)
        results[side] = {
            "real_tokens": tokens,
            "seconds": seconds,
            **flops.step_metrics(tokens, squares, seconds, 1),
        }
        del model, wrapped, optimizer
        if device.type == "cuda":
            results[side]["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1024**3
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    results["packed_over_padded"] = (
        results["packed"]["tokens_per_second_per_device"]
        / results["padded"]["tokens_per_second_per_device"]
    )
    return results


class _Runtime:
    def __init__(self, device):
        self.device, self.is_cuda, self.is_main = device, device.type == "cuda", True


def _device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()


def _sync_time(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _packed_step(model, samples, cap, name, device):
    from mini_trainer.batching.collator import plan_step

    lengths = np.array([len(s["input_ids"]) for s in samples])
    loss_tokens = np.array([count_loss_tokens(s["labels"]) for s in samples])
    plan = plan_step(np.arange(len(samples)), lengths, loss_tokens, 1, cap)
    for ranks in plan.micro_batches:
        micro = collate_packed([samples[i] for i in ranks[0]], plan.batch_num_loss_tokens)
        micro = micro.to(device)
        loss = model(
            micro.input_ids,
            micro.position_ids,
            micro.target_ids,
            loss_rows=micro.loss_rows,
            **attention.attention_kwargs(name, micro),
        )
        (loss / plan.batch_num_loss_tokens).backward()


def _padded_step(model, samples, per_micro, device):
    total = sum(count_loss_tokens(s["labels"]) for s in samples)
    for start in range(0, len(samples), per_micro):
        group = samples[start : start + per_micro]
        width = max(len(s["input_ids"]) for s in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        targets = torch.full((len(group), width), -100)
        for row, s in enumerate(group):
            n = len(s["input_ids"])
            ids[row, :n], mask[row, :n] = torch.tensor(s["input_ids"]), 1
            targets[row, : n - 1] = torch.tensor(s["labels"][1:])
        ids, mask, targets = ids.to(device), mask.to(device), targets.to(device)
        hidden = model.model.get_decoder()(
            input_ids=ids, attention_mask=mask, use_cache=False
        ).last_hidden_state
        weight = model.model.get_output_embeddings().weight
        loss = chunked_linear_cross_entropy(
            hidden.flatten(0, 1), weight.to(hidden.dtype), targets.flatten()
        )
        (loss / total).backward()


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def same_bytes(run: Path, other: Path) -> bool:
    """Two runs of one command gave the same weights (every file of final/ but its
    training_args.json, which names the output folder) and the same metrics but the measured
    fields (time, speed, memory)."""
    from mini_trainer.training.metrics import MEASURED_FIELDS

    def computed(folder: Path) -> tuple[dict, list[dict]]:
        files = {p.name: p.read_bytes() for p in (folder / "final").iterdir()}
        files.pop("training_args.json", None)
        rows = [{k: v for k, v in r.items() if k not in MEASURED_FIELDS} for r in _metrics(folder)]
        return files, rows

    return computed(run) == computed(other)


def training_summary(args) -> dict:
    rows = _metrics(Path(args.run))
    first, last = rows[0], rows[-1]
    steady = rows[len(rows) // 2 :]
    same = (
        {}
        if args.same_as is None
        else {"same_bytes": same_bytes(Path(args.run), Path(args.same_as))}
    )
    return {
        **same,
        "steps": len(rows),
        "first_loss": first["loss"],
        "last_loss": last["loss"],
        "loss_fell": last["loss"] < first["loss"],
        "tokens_per_second_per_device": float(
            np.median([r["tokens_per_second_per_device"] for r in steady])
        ),
        "mfu": None if last.get("mfu") is None else float(np.median([r["mfu"] for r in steady])),
        "peak_memory_gb": last["peak_memory_gb"],
    }


def summarize(args) -> dict:
    parts = {}
    for path in sorted(Path(args.parts).glob("*.status.json")):
        name = path.name.removesuffix(".status.json")
        part = json.loads(path.read_text())
        result = path.with_name(f"{name}.json")
        if result.is_file():
            try:
                part["result"] = json.loads(result.read_text())
            except ValueError:
                part["result"] = None
        parts[name] = part
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu_dry_run": args.cpu_dry_run,
        "device": _device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        "torch": torch.__version__,
        "parts": parts,
    }
    print(f"{'part':<22} {'status':<8} {'seconds':>8}  detail")
    for name, part in parts.items():
        print(f"{name:<22} {part['status']:<8} {part['seconds']:>8.1f}  {_detail(part)}")
    return summary


def _detail(part) -> str:
    result = part.get("result") or {}
    if "families" in result:
        worst = max(
            (rel, f"{family}/{path}")
            for family, paths in result["families"].items()
            for path, rel in paths.items()
        )
        return f"{len(result['families'])} families, worst rel {worst[0]:.1e} ({worst[1]})"
    if "paths" in result:
        return ", ".join(
            f"{n}: rel {r['rel_diff']:.1e} {r['fwd_bwd_s'] * 1e3:.0f} ms"
            for n, r in result["paths"].items()
        )
    if "packed_over_padded" in result:
        mfu = result["packed"]["mfu"]
        return (
            f"packed/padded {result['packed_over_padded']:.2f}x, packed "
            f"{result['packed']['tokens_per_second_per_device']:,.0f} tok/s, mfu "
            f"{'n/a' if mfu is None else f'{mfu:.1%}'} ({result['attention']})"
        )
    if "anchor_tokens_per_gpu_s" in result:  # benchmarks/context_parallel.py --gpu
        return (
            f"CP {result['ranks']}, {result['tokens']:,} tokens: "
            f"{result['tokens_per_gpu_s']:,.0f} tok/s per GPU (anchor "
            f"{result['anchor_tokens_per_gpu_s']:,})"
        )
    if "last_loss" in result:
        mfu = result["mfu"]
        same = result.get("same_bytes")
        return (
            f"loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}, "
            f"{result['tokens_per_second_per_device']:,.0f} tok/s, mfu "
            f"{'n/a' if mfu is None else f'{mfu:.1%}'}"
            + ("" if same is None else f", run twice: {'same' if same else 'DIFFERENT'} bytes")
        )
    return part.get("tail", "")[-80:].replace("\n", " ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "part", choices=("attention", "families", "throughput", "training", "summarize")
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--run")
    parser.add_argument("--same-as", help="training: another run of the same command to match")
    parser.add_argument("--parts")
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    work = {
        "attention": check_attention,
        "families": check_families,
        "throughput": throughput,
        "training": training_summary,
        "summarize": summarize,
    }[args.part]
    result = work(args)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.part in ("attention", "families") and not result["ok"]:
        sys.exit(1)
    if result.get("same_bytes") is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
