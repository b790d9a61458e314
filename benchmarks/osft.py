"""OSFT against full fine-tuning on a random-init Llama (8 layers, hidden 1,024), one process.

Measures, both sides in this process, sides interleaved in every round so other processes'
load hits them alike, median of --repeats rounds:
- start-up: OSFT's adapt_model + convert_weights with the `osft-svd` cache (checks included:
  content hash of the weights, sha256 of the cache files) against computing the SVD;
- step: one training step (--micro-batches forward + backward passes of --tokens tokens each,
  AdamW, the method's hooks) of OSFT at --ratio against full fine-tuning. The rebuild of W is
  paid per micro-batch, the projections once per step;
- memory: bytes of parameters + gradients + AdamW state after a step, OSFT against full.

    OMP_NUM_THREADS=1 python benchmarks/osft.py [--tokens 1024] [--micro-batches 1] [--repeats 3]
        [--startup-repeats N] [--ratio 0.25]

(one thread: on a shared 2-core machine, two OpenMP threads per process make LAPACK's SVD
about 4x slower.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mini_trainer.method import FullFineTuning
from mini_trainer.osft.build import build_cache
from mini_trainer.osft.method import OSFT


def build_model(folder: Path) -> LlamaConfig:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
        use_cache=False,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return config


def osft_args(folder: Path, ratio: float, cache: Path | None) -> SimpleNamespace:
    return SimpleNamespace(
        osft_unfreeze_rank_ratio=ratio, osft_target_patterns=None, osft_rank_mode="uniform",
        osft_min_frozen_ratio=0.1, osft_max_frozen_ratio=0.8,
        osft_svd_cache=str(cache) if cache else None, osft_freeze_non_targets=False,
        output_dir=str(folder / "out"), resume=False, model_name_or_path=str(folder / "model"),
        data_path="", seed=0,
    )  # fmt: skip


def start_up(folder: Path, config, state, ratio, cache) -> tuple[float, OSFT, torch.nn.Module]:
    """Seconds for OSFT's adapt_model + convert_weights; (seconds, method, adapted model)."""
    started = time.perf_counter()
    method = OSFT(osft_args(folder, ratio, cache))
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    method.adapt_model(model)
    converted = method.convert_weights(dict(state))
    seconds = time.perf_counter() - started
    model.to_empty(device="cpu")
    model.load_state_dict(converted, strict=False)
    return seconds, method, model


def step(method, model, optimizer, ids, micro_batches: int = 1) -> float:
    """Seconds for one optimizer step: `micro_batches` forward + backward passes of `ids`."""
    started = time.perf_counter()
    for _ in range(micro_batches):
        model(input_ids=ids, labels=ids).loss.backward()
    method.before_optimizer_step(model)
    optimizer.step()
    method.after_optimizer_step(model)
    optimizer.zero_grad(set_to_none=False)  # keep gradients allocated, as during training
    return time.perf_counter() - started


def training_bytes(model, optimizer) -> dict[str, int]:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.grad is not None)
    states = sum(
        t.numel() * t.element_size()
        for s in optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )
    return {"params": params, "grads": grads, "optimizer": states, "total": params + grads + states}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="Tokens per micro-batch.")
    parser.add_argument(
        "--micro-batches", type=int, default=1, help="Micro-batches per step (accumulated)."
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ratio", type=float, default=0.25, help="OSFT unfreeze rank ratio.")
    parser.add_argument(
        "--startup-repeats", type=int, default=None, help="Start-up rounds (default: --repeats)."
    )
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}, torch threads {torch.get_num_threads()}")

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = build_model(folder / "model")
        full_model = LlamaForCausalLM.from_pretrained(folder / "model", dtype=torch.float32)
        state = full_model.state_dict()
        model_bytes = sum(p.stat().st_size for p in (folder / "model").glob("*.safetensors"))

        started = time.perf_counter()
        build_cache(folder / "model", folder / "cache", None, force=False)
        build_seconds = time.perf_counter() - started
        cache_bytes = sum(p.stat().st_size for p in (folder / "cache").iterdir())

        print(f"cache built in {build_seconds:.1f} s", flush=True)
        times = {"svd": [], "cache": []}
        for _ in range(
            max(1, args.repeats if args.startup_repeats is None else args.startup_repeats)
        ):
            times["svd"].append(start_up(folder, config, state, args.ratio, None)[0])
            seconds, method, osft_model = start_up(
                folder, config, state, args.ratio, folder / "cache"
            )
            times["cache"].append(seconds)
            print(f"start-up: svd {times['svd'][-1]:.1f} s, cache {seconds:.1f} s", flush=True)

        full = FullFineTuning()
        sides = {
            "full": (full, full_model, torch.optim.AdamW(full.param_groups(full_model, 0.1))),
            "osft": (method, osft_model,
                     torch.optim.AdamW(method.param_groups(osft_model, 0.1))),
        }  # fmt: skip
        ids = torch.randint(0, config.vocab_size, (1, args.tokens))
        step_times = {name: [] for name in sides}
        for side in sides.values():  # warm-up: allocates gradients and AdamW state
            step(*side, ids)
        for _ in range(args.repeats):
            for name, side in sides.items():
                step_times[name].append(step(*side, ids, args.micro_batches))
                print(f"step {name}: {step_times[name][-1]:.2f} s", flush=True)
        memory = {name: training_bytes(model, opt) for name, (_, model, opt) in sides.items()}

    svd_s, cache_s = statistics.median(times["svd"]), statistics.median(times["cache"])
    full_s, osft_s = statistics.median(step_times["full"]), statistics.median(step_times["osft"])
    mib = 1024**2
    print(f"load average after: {os.getloadavg()}")
    print(f"model: 8 layers, hidden 1024, intermediate 2816; weights {model_bytes / mib:.0f} MiB")
    print(f"osft-svd cache: built in {build_seconds:.1f} s, {cache_bytes / mib:.0f} MiB on disk "
          f"({cache_bytes / model_bytes:.2f}x the model's safetensors)")  # fmt: skip
    print("| measure | OSFT | reference | ratio | goal |")
    print("| --- | --- | --- | --- | --- |")
    rounds = len(times["svd"])
    print(f"| start-up (s, median of {rounds}) | cache {cache_s:.2f} | SVD {svd_s:.2f} | "
          f"{svd_s / cache_s:.1f}x faster | >= 10x |")  # fmt: skip
    rounds_ratio = [o / f for o, f in zip(step_times["osft"], step_times["full"], strict=True)]
    tokens = f"{args.micro_batches} x {args.tokens}" if args.micro_batches > 1 else args.tokens
    print(f"| step time, {tokens} tokens (s, median of {args.repeats}) | {osft_s:.2f} | "
          f"full {full_s:.2f} | {osft_s / full_s:.2f}x (median of the rounds' ratios "
          f"{statistics.median(rounds_ratio):.2f}x; rounds "
          f"{', '.join(f'{r:.2f}' for r in rounds_ratio)}) | <= 1.3x |")  # fmt: skip
    for part in ("params", "grads", "optimizer", "total"):
        o, f = memory["osft"][part], memory["full"][part]
        print(f"| {part} (MiB) | {o / mib:.0f} | full {f / mib:.0f} | {o / f:.2f}x | "
              f"{'<= 1.0x' if part == 'total' else ''} |")  # fmt: skip


if __name__ == "__main__":
    main()
