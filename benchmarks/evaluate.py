"""`mini-trainer evaluate` against a plain padded transformers evaluation loop, same samples.

Both sides run in this one process on the demo model (fp32, CPU) over the same eval samples
(the three demo tasks' eval files, 600 samples) and compute the same numbers:
- evaluate: `evaluate_model` (validation, LPT-packed padding-free rows under a token cap,
  per-sample sdpa, FSDP2 world of one, chunked logits);
- padded: batches of `--batch-size` samples in file order, right-padded with an attention mask,
  `model(...).logits` for the whole batch, shift, cross-entropy and arg-max (the usual loop).
Only the loop is timed on each side (not model loading or validation). The sides alternate,
`--repeats` times each; the medians of real (non-pad) tokens per second and their ratio are
printed with the load average. The two losses must agree (1e-5 relative) or the run fails.

    python benchmarks/evaluate.py [--repeats 5] [--batch-size 16] [--cap 2048] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch


def padded_loop(model, samples: list[dict], batch_size: int) -> tuple[float, float, int, int]:
    """(seconds, loss sum, loss tokens, real tokens) of the plain padded evaluation."""
    loss_sum, loss_tokens, tokens = 0.0, 0, 0
    started = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(samples), batch_size):
            batch = samples[start : start + batch_size]
            width = max(len(s["input_ids"]) for s in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            for row, s in enumerate(batch):
                n = len(s["input_ids"])
                ids[row, :n] = torch.tensor(s["input_ids"])
                mask[row, :n] = 1
                labels[row, :n] = torch.tensor(s["labels"])
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            targets = labels[:, 1:]
            keep = targets != -100
            loss_sum += torch.nn.functional.cross_entropy(
                logits[keep], targets[keep], reduction="sum"
            ).item()
            _ = (logits[keep].argmax(-1) == targets[keep]).sum()  # accuracy, as evaluate does
            loss_tokens += int(keep.sum())
            tokens += int(mask.sum())
    return time.perf_counter() - started, loss_sum, loss_tokens, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16, help="padded: samples per batch")
    parser.add_argument("--cap", type=int, default=2048, help="evaluate: tokens per micro-batch")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from mini_trainer.demo.assets import DemoSpec, build_demo_assets
    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.evaluate.runner import evaluate_model

    hf_logging.set_verbosity_error()
    runtime = init_runtime()
    with tempfile.TemporaryDirectory() as tmp:
        build_demo_assets(Path(tmp), DemoSpec())
        data = Path(tmp) / "all.eval.jsonl"
        lines = []
        for path in sorted((Path(tmp) / "data").glob("*.eval.jsonl")):
            lines += path.read_text().splitlines()
        data.write_text("\n".join(lines) + "\n")
        samples = [json.loads(line) for line in lines]
        model_dir = Path(tmp) / "model"
        padded_model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        print(f"{len(samples)} samples, {sum(len(s['input_ids']) for s in samples):,} tokens")
        rates = {"padded": [], "evaluate": []}
        for repeat in range(args.repeats):
            seconds, loss_sum, loss_tokens, tokens = padded_loop(
                padded_model, samples, args.batch_size
            )
            rates["padded"].append(tokens / seconds)
            ours = evaluate_model(model_dir, data, runtime, max_tokens_per_gpu=args.cap)
            rates["evaluate"].append(ours["tokens_per_second"])
            assert ours["num_tokens"] == tokens and ours["num_loss_tokens"] == loss_tokens
            assert abs(ours["loss"] - loss_sum / loss_tokens) <= 1e-5 * ours["loss"]
            print(
                f"run {repeat + 1}: padded {tokens / seconds:,.0f} tok/s ({seconds:.2f} s), "
                f"evaluate {ours['tokens_per_second']:,.0f} tok/s ({ours['elapsed_s']:.2f} s), "
                f"loss {ours['loss']:.5f}"
            )
    shutdown()
    padded, packed = (statistics.median(rates[k]) for k in ("padded", "evaluate"))
    print(f"median padded:   {padded:,.0f} tokens/s")
    print(f"median evaluate: {packed:,.0f} tokens/s")
    print(f"evaluate / padded: {packed / padded:.2f}x; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
