"""Padding-free packed micro-batches against padded micro-batches, same model, same tokens.

Both sides train the demo Llama (fp32, CPU) on the same 2,000 long-tailed demo samples in the
same order, with the same loss (chunked linear cross-entropy) and AdamW:
- packed: each global batch is planned by `plan_micro_batches` under a token cap and every
  micro-batch is one row with restarting position ids (what `mini_trainer.train` does);
- padded: a fixed number of samples per micro-batch, padded to the longest with an attention
  mask (what Hugging Face's default collator does);
- packed, prefetched: the packed side as the engine now runs it: plans and rows prepared by
  `StepPrefetcher` in a background thread, sample boundaries and loss rows handed over from
  the host (`attention_kwargs`, `loss_rows`) instead of found from device tensors.
Every side reads its samples by parsing their JSON lines (as the training dataset does), in the
order of one epoch of `BatchSampler`. It prints real (non-pad) tokens per second of each side
and the ratios packed / padded and prefetched / packed.
It runs the sides `--repeats` times (alternating) and prints the median of each side, the
ratios of the medians, and the machine's load average before and after (it may be shared).

    python benchmarks/throughput.py [--samples 2000] [--batch-size 32] [--cap 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mini_trainer.batching.collator import collate_packed, count_loss_tokens, plan_step
from mini_trainer.batching.sampler import BatchSampler
from mini_trainer.demo.assets import DemoSpec, build_demo_assets
from mini_trainer.training import packed_attention
from mini_trainer.training.attention import attention_kwargs
from mini_trainer.training.loss import chunked_linear_cross_entropy
from mini_trainer.training.prefetch import StepPrefetcher


class JsonLinesDataset:
    """Samples kept as JSON lines and parsed on every access, like the training dataset."""

    def __init__(self, samples: list[dict]):
        self.lines = [json.dumps(s) for s in samples]
        self.lengths = np.array([len(s["input_ids"]) for s in samples], dtype=np.int64)
        self.loss_tokens = np.array([count_loss_tokens(s["labels"]) for s in samples])

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> dict:
        return json.loads(self.lines[i])


def epoch_batches(dataset, batch_size: int):
    sampler = BatchSampler(len(dataset), batch_size, seed=0)
    for _ in range(sampler.batches_per_epoch):
        yield sampler.next_batch()


def load_samples(data_dir: Path, count: int, seed: int) -> list[dict]:
    rows = []
    for path in sorted(data_dir.glob("*.train.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    order = np.random.default_rng(seed).permutation(len(rows))[:count]
    return [rows[i] for i in order]


def packed_micro_batches(dataset, batch_size, cap):
    """Before: each step planned, read and collated in the loop, when it is due."""
    for batch in epoch_batches(dataset, batch_size):
        plan = plan_step(batch.indices, dataset.lengths, dataset.loss_tokens, 1, cap)
        yield (
            [
                collate_packed([dataset[i] for i in ranks[0]], plan.batch_num_loss_tokens)
                for ranks in plan.micro_batches
            ],
            plan.batch_num_loss_tokens,
        )


def prefetched_micro_batches(dataset, batch_size, cap):
    """After: the same steps, prepared ahead by the engine's background thread."""
    sampler = BatchSampler(len(dataset), batch_size, seed=0)
    with StepPrefetcher(
        sampler, dataset, rank=0, world_size=1, max_tokens_per_rank=cap, pad_id=0,
        pin_memory=False,
    ) as prefetcher:  # fmt: skip
        for _ in range(sampler.batches_per_epoch):
            plan, micro_batches = prefetcher.prepare(sampler.next_batch())
            yield micro_batches, plan.batch_num_loss_tokens


def padded_micro_batches(dataset, batch_size, per_micro, pad_id):
    for global_batch in epoch_batches(dataset, batch_size):
        batch = [dataset[i] for i in global_batch.indices]
        total_loss_tokens = sum(count_loss_tokens(s["labels"]) for s in batch)
        micros = []
        for m in range(0, len(batch), per_micro):
            group = batch[m : m + per_micro]
            width = max(len(s["input_ids"]) for s in group)
            ids = torch.full((len(group), width), pad_id)
            mask = torch.zeros((len(group), width), dtype=torch.long)
            targets = torch.full((len(group), width), -100)
            for row, s in enumerate(group):
                n = len(s["input_ids"])
                ids[row, :n] = torch.tensor(s["input_ids"])
                mask[row, :n] = 1
                targets[row, : n - 1] = torch.tensor(s["labels"][1:])
            micros.append((ids, mask, targets))
        yield micros, total_loss_tokens


def run_packed(model, dataset, args, prefetch: bool = False) -> tuple[float, int]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens, started = 0, time.perf_counter()
    weight = model.get_output_embeddings().weight
    steps = (prefetched_micro_batches if prefetch else packed_micro_batches)(
        dataset, args.batch_size, args.cap
    )
    for micros, total in steps:
        for micro in micros:
            # Before: boundaries found from the position ids, loss rows by a nonzero.
            # After: both handed over from the host, as the engine does.
            extra = attention_kwargs(packed_attention.NAME, micro) if prefetch else {}
            hidden = model.get_decoder()(
                input_ids=micro.input_ids, position_ids=micro.position_ids, use_cache=False,
                **extra,
            ).last_hidden_state  # fmt: skip
            rows = micro.loss_rows if prefetch else None
            loss = chunked_linear_cross_entropy(hidden[0], weight, micro.target_ids[0], rows=rows)
            (loss / total).backward()
            tokens += micro.num_tokens
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started, tokens


def run_padded(model, dataset, args, pad_id) -> tuple[float, int]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens, started = 0, time.perf_counter()
    weight = model.get_output_embeddings().weight
    for micros, total in padded_micro_batches(dataset, args.batch_size, args.per_micro, pad_id):
        for ids, mask, targets in micros:
            hidden = model.get_decoder()(
                input_ids=ids, attention_mask=mask, use_cache=False
            ).last_hidden_state
            loss = chunked_linear_cross_entropy(hidden.flatten(0, 1), weight, targets.flatten())
            (loss / total).backward()
            tokens += int(mask.sum())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per optimizer step")
    parser.add_argument("--cap", type=int, default=2048, help="packed: tokens per micro-batch")
    parser.add_argument("--per-micro", type=int, default=8, help="padded: samples per micro")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side")
    parser.add_argument(
        "--order", default="padded,packed,prefetched", help="sides, in the order they run"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        build_demo_assets(Path(tmp), DemoSpec())
        samples = load_samples(Path(tmp) / "data", args.samples, seed=0)
        dataset = JsonLinesDataset(samples)
        lengths = dataset.lengths
        print(
            f"{len(samples)} samples, {lengths.sum()} tokens; length mean {lengths.mean():.0f}, "
            f"median {np.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, "
            f"max {lengths.max()}"
        )
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        sides = args.order.split(",")  # padded first by default: no warm-up advantage for packed
        runs: dict[str, list[tuple[float, int]]] = {name: [] for name in sides}
        for repeat in range(args.repeats):
            for name in sides:
                torch.manual_seed(0)
                # Each side with the attention it is made for: per-sample sdpa for packed rows
                # (what mini_trainer.train uses on CPU), masked sdpa for padded batches.
                attention = "sdpa" if name == "padded" else packed_attention.register()
                model = AutoModelForCausalLM.from_pretrained(
                    Path(tmp) / "model", attn_implementation=attention
                ).train()
                if name == "padded":
                    seconds, tokens = run_padded(model, dataset, args, pad_id=0)
                else:
                    seconds, tokens = run_packed(
                        model, dataset, args, prefetch=name == "prefetched"
                    )
                runs[name].append((seconds, tokens))
                print(
                    f"run {repeat + 1} {name:>10}: {tokens} real tokens in {seconds:.1f} s "
                    f"= {tokens / seconds:,.0f} tok/s"
                )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tokens = {t for side in runs.values() for _, t in side}
    assert len(tokens) == 1, "every side must train on the same tokens"
    (count,) = tokens
    medians = {name: statistics.median(s for s, _ in side) for name, side in runs.items()}
    for name, seconds in medians.items():
        print(f"median {name:>10}: {seconds:.1f} s = {count / seconds:,.0f} tok/s")
    if "packed" in medians and "padded" in medians:
        ratio = medians["padded"] / medians["packed"]  # same tokens: time ratio = rate ratio
        print(f"packed / padded tokens per second (medians): {ratio:.2f}x (goal >= 1.5x)")
    if "packed" in medians and "prefetched" in medians:
        ratio = medians["packed"] / medians["prefetched"]
        print(f"prefetched / packed tokens per second (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
