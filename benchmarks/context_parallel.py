"""Context parallelism's cost: a step of CP N against CP 1 on the same tokens (CPU), or the
tokens/s of one long sample at CP N (GPU).

    python benchmarks/context_parallel.py                      # CPU: CP 2 vs CP 1, 2 ranks
    python benchmarks/context_parallel.py --gpu --nproc 8 --tokens 131072   # 8B, CP 8

It starts itself under torchrun (`--nproc` ranks, one CP group). The model is random-init and
built on the meta device, sharded with FSDP2 and initialised in place (no weights written or
read): a Llama of hidden 256 x 4 layers on the CPU, Llama-3.1-8B's config
(tests/fixtures/plan/llama-3.1-8b) on the GPU, bf16 compute, activation checkpointing.

One "step" is forward + backward of one packed row (no optimizer step: it is the same with and
without CP). CPU: the row holds `--docs` documents; CP 1 is rank 0 running the whole row while
rank 1 runs a one-token dummy row (FSDP's collectives still run), CP 2 each rank's zig-zag
chunk. Reported: the median step time of each, the speed-up and the overhead (2 x the CP 2 time
over the CP 1 time, minus 1: the extra rank-seconds CP spends on the same tokens). GPU: one
sample of `--tokens` tokens at CP `--nproc`, tokens/s per GPU beside torchtitan's published
1,071 tokens/s per H100 (Llama-3.1-8B, 131,072 tokens, CP 8) as the anchor. Prints the CPU model
and the load average: CPU figures on the shared machine are measured under load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TORCHTITAN_TOKENS_PER_GPU_S = 1071
"""torchtitan, Llama-3.1-8B, 131,072-token sequences, CP 8 on 8 H100 (its published figure)."""


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="8B config, one long sample, CUDA")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one CP group)")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens in the row")
    parser.add_argument("--docs", type=int, default=3, help="documents in the row (CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON too")
    return parser.parse_args()


def launch(options: argparse.Namespace) -> None:
    """Re-run this script under torchrun with `--nproc` ranks."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(options.nproc), __file__, *sys.argv[1:]]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    raise SystemExit(subprocess.run(command, env=env).returncode)


def build(config, runtime, group):
    """The FSDP2 training model, random-init in place, attention over the CP group."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from mini_trainer.method import FullFineTuning, MethodContext
    from mini_trainer.training import context_attention, packed_attention
    from mini_trainer.training.attention import pick_attention
    from mini_trainer.training.loss import chunked_linear_cross_entropy
    from mini_trainer.training.model_setup import fsdp_units, meta_model, shard_policy

    config.use_cache = False
    config._attn_implementation = packed_attention.register()
    context = MethodContext(runtime, Path("."), None)
    wrapped = meta_model(config, chunked_linear_cross_entropy, FullFineTuning(), context,
                         activation_checkpointing=True)  # fmt: skip
    pick_attention(runtime)  # registers the per-sample path (CP 1's)
    context_attention.register(group)
    for unit in fsdp_units(wrapped):
        fully_shard(unit, **shard_policy(runtime.is_cuda, False))
    wrapped.to_empty(device=runtime.device)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in wrapped.parameters():
            param.normal_(0.0, 0.02)
        for module in wrapped.modules():  # rotary frequencies: recomputed, as loading does
            if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
                inv_freq, scaling = module.rope_init_fn(module.config, runtime.device)
                module.inv_freq, module.attention_scaling = inv_freq, scaling
    return wrapped.train()


def step_seconds(wrapped, micro, name: str, device, repeats: int) -> list[float]:
    import torch
    import torch.distributed as dist

    from mini_trainer.training import attention

    wrapped.model.set_attn_implementation(name)
    micro = micro.to(device)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        dist.barrier()
        start = time.perf_counter()
        kwargs = attention.attention_kwargs(name, micro)
        loss = wrapped(micro.input_ids, micro.position_ids, micro.target_ids,
                       loss_rows=micro.loss_rows, **kwargs)  # fmt: skip
        loss.backward()
        wrapped.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()  # the step ends when the slowest rank ends
        times.append(time.perf_counter() - start)
    return times[1:]


def main(options: argparse.Namespace) -> None:
    import torch
    from machine import cpu_model, load_line  # benchmarks/machine.py
    from transformers import AutoConfig, LlamaConfig

    from mini_trainer.batching.collator import collate_packed
    from mini_trainer.batching.context_split import split_row
    from mini_trainer.distributed.context_groups import context_groups
    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.training import context_attention
    from mini_trainer.training.attention import PER_SAMPLE_NAME

    runtime = init_runtime()
    groups = context_groups(runtime, runtime.world_size)
    if options.gpu:
        config = AutoConfig.from_pretrained(REPO / "tests/fixtures/plan/llama-3.1-8b")
        docs = 1
    else:
        config = LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             vocab_size=4096, max_position_embeddings=1 << 17)  # fmt: skip
        docs = options.docs
    if runtime.is_main:
        print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {load_line('before')}")
        device = torch.cuda.get_device_name() if runtime.is_cuda else "cpu, fp32, 1 thread/rank"
        print(f"{runtime.world_size} ranks ({device}); {options.tokens:,} tokens, {docs} docs")
    wrapped = build(config, runtime, groups.group)
    gen = torch.Generator().manual_seed(0)
    cuts = sorted(torch.randperm(options.tokens - 1, generator=gen)[: docs - 1].add(1).tolist())
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, options.tokens], strict=True)]
    samples = []
    for n in sizes:
        ids = torch.randint(3, config.vocab_size, (n,), generator=gen).tolist()
        samples.append({"input_ids": ids, "labels": ids})
    row = collate_packed(samples, 1)
    result = {"tokens": options.tokens, "docs": docs, "ranks": runtime.world_size}
    chunk = split_row(row, groups.size, groups.rank)
    cp_times = step_seconds(wrapped, chunk, context_attention.NAME, runtime.device,
                            options.repeats)  # fmt: skip
    result["cp_step_s"] = statistics.median(cp_times)
    result["tokens_per_gpu_s"] = options.tokens / result["cp_step_s"] / runtime.world_size
    if not options.gpu:
        whole = row if runtime.is_main else collate_packed([], 1)
        one = step_seconds(wrapped, whole, PER_SAMPLE_NAME, runtime.device, options.repeats)
        result["cp1_step_s"] = statistics.median(one)
        result["speedup"] = result["cp1_step_s"] / result["cp_step_s"]
        result["overhead"] = runtime.world_size * result["cp_step_s"] / result["cp1_step_s"] - 1
    if runtime.is_main:
        if options.gpu:
            print(f"CP {runtime.world_size}: step {result['cp_step_s']:.2f} s, "
                  f"{result['tokens_per_gpu_s']:,.0f} tokens/s per GPU (forward + backward, "
                  f"no optimizer step); anchor: torchtitan {TORCHTITAN_TOKENS_PER_GPU_S:,} "
                  "tokens/s per H100")  # fmt: skip
            result["anchor_tokens_per_gpu_s"] = TORCHTITAN_TOKENS_PER_GPU_S
        else:
            print(f"CP 1 (one rank, the whole row): {result['cp1_step_s']:.3f} s; "
                  f"CP {runtime.world_size}: {result['cp_step_s']:.3f} s; speed-up "
                  f"{result['speedup']:.2f}x, overhead {result['overhead']:+.0%} rank-seconds "
                  "(measured under load: see the load average)")  # fmt: skip
        print(load_line("after"))
        if options.out:
            options.out.write_text(json.dumps(result, indent=2) + "\n")
    shutdown()


if __name__ == "__main__":
    opts = parse()
    if "LOCAL_RANK" not in os.environ:
        launch(opts)
    sys.path.insert(0, str(Path(__file__).parent))
    main(opts)
