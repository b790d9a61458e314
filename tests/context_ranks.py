"""Run under torchrun (4 ranks, gloo; 2 also work): context parallelism against CP 1, several
families and rows in one launch. Rank 0 writes {case: [per-sample loss relative error, [(worst
tensor, its relative error), ...]]} to ARGV[1].

Part 1. For each family one FSDP2 model is built by the engine's `build_model` over the whole
world. CP 1 is the model on the per-sample path: rank 0 runs the whole row, every other rank a
dummy row (FSDP sums them). CP N, for every N > 1 that divides the world (2 and 4 on 4 ranks), is
each rank's zig-zag chunk (`split_row`) through context-parallel attention over its group (the
real all-gather, its backward included); with N = 2 on 4 ranks the second group (dp rank 1)
splits a dummy row. One loss returns each sample's summed token loss, so the comparison is per
sample, not only per row.

Part 2 ("engine: ..."). The training loop itself (`loop.train`) on a llama, with samples up to
twice `--max-tokens-per-gpu` and a short last batch in each of 2 epochs: --context-parallel 2
(dp 2 x cp 2 on 4 ranks) with a cap of 16 against CP 1 with twice the cap (every rank its own
data-parallel rank, so another packing plan): every step's loss and the exported weights. The
CP 2 run also checkpoints activations (both runs reduce gradients once per step) and saves a
state at step 2, which a third run resumes on CP 4 (one group of 4, a cap of 8: the same group
budget; on 2 ranks, CP 1). The export runs under CP, so it is checked too.

`python -m torch.distributed.run --standalone --nproc-per-node 4 tests/context_ranks.py OUT DIR`
(the test).
"""

from __future__ import annotations

import bisect
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from families import build_model, full_grads, relative_error, samples, worst_errors
from safetensors.torch import load_file

from mini_trainer.batching.collator import collate_packed
from mini_trainer.batching.context_split import split_row
from mini_trainer.distributed.context_groups import context_groups
from mini_trainer.distributed.runtime import init_runtime
from mini_trainer.method import FullFineTuning
from mini_trainer.training import attention, context_attention
from mini_trainer.training.loop import train
from mini_trainer.training.model_setup import ModelSpec
from mini_trainer.training.model_setup import build_model as build_sharded
from mini_trainer.training_args import TrainingArgs

FAMILIES = ["llama", "gemma2", "gpt_oss"]
"""The baseline; soft-capped attention and logits with sliding-window layers; sinks (and
windows again). Every attention feature is also checked in process (test_context_parallel)."""
ROWS = {
    "documents crossing every boundary": [5, 7, 3, 10, 5],
    "one document longer than a chunk": [23, 4],
    "short last batch (padding)": [4, 3],
    "no sample (a dummy row)": [],
}


def per_sample_loss(sample_of_token: torch.Tensor, num_samples: int):
    """A loss with the engine's keywords that returns (num_samples,) summed token losses."""

    def loss_fn(hidden, weight, targets, *, rows=None, bias=None, logit_scale=1.0, softcap=None):
        logits = F.linear(hidden, weight, bias) * logit_scale
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        token = F.cross_entropy(logits, targets, reduction="none", ignore_index=-100)
        keep = targets != -100
        return token.new_zeros(num_samples).index_add(0, sample_of_token[keep], token[keep])

    return loss_fn


def sample_ids(micro) -> torch.Tensor:
    """Each token's sample in the row (the padding: one past the last)."""
    if micro.context is None:
        starts = micro.seq_starts
        return torch.tensor([bisect.bisect_right(starts, i) - 1 for i in range(starts[-1])])
    layout = micro.context
    return torch.tensor([layout.document_of(int(i)) for i in layout.global_index()])


def step(wrapped, micro, num_samples: int, name: str) -> torch.Tensor:
    wrapped.zero_grad(set_to_none=True)
    wrapped.model.set_attn_implementation(name)
    loss_fn = per_sample_loss(sample_ids(micro), num_samples + 1)
    # a chunk's kwargs are the context layout, whatever name its group's attention has
    kwargs = attention.attention_kwargs(context_attention.NAME if micro.context else name, micro)
    losses = wrapped(micro.input_ids, micro.position_ids, micro.target_ids, loss_fn=loss_fn,
                     **kwargs)  # fmt: skip
    losses.sum().backward()
    losses = losses.detach()[:num_samples]
    dist.all_reduce(losses)
    return losses


def main(out: str, work: str) -> None:
    runtime = init_runtime()
    sizes = [n for n in (2, 4) if runtime.world_size % n == 0]
    groups = {n: context_groups(runtime, n) for n in sizes}  # every rank, the same order
    names = {n: context_attention.register(g.group, f"{context_attention.NAME}_{n}")
             for n, g in groups.items()}  # fmt: skip
    results = {}
    for family in FAMILIES:
        model = build_model(family)
        folder = Path(work) / family
        if runtime.is_main:
            model.save_pretrained(folder)
        dist.barrier()
        wrapped, _ = build_sharded(ModelSpec(str(folder)), None, runtime, FullFineTuning(),
                                   context_group=groups[2].group)  # fmt: skip
        wrapped.train()
        per_sample = attention.pick_attention(runtime)
        for case, lengths in ROWS.items():
            batch = samples(model.config.vocab_size, lengths)
            row = collate_packed(batch, 1, model.config.pad_token_id)
            dummy = collate_packed([], 1)
            want_loss = step(wrapped, row if runtime.is_main else dummy, len(batch), per_sample)
            want = full_grads(wrapped, runtime.world_size)
            for n, group in groups.items():
                chunk = split_row(row if group.dp_rank == 0 else dummy, n, group.rank)
                got_loss = step(wrapped, chunk, len(batch), names[n])
                got = full_grads(wrapped, runtime.world_size)
                results[f"{family}: CP {n}: {case}"] = [relative_error(got_loss, want_loss),
                                                        worst_errors(got, want)]  # fmt: skip
        del wrapped
    results.update(engine(Path(work), runtime))
    if runtime.is_main:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


ENGINE_LENGTHS = [30, 5, 17, 9, 12, 22, 7]
"""7 samples, batch 5: a full step, then a short last one; 30 and 22 are over the cap of 16."""


def engine(work: Path, runtime) -> dict:
    """CP 2 with a cap of 16 against CP 1 (every rank a DP rank) with 32, through `loop.train`,
    4 steps (2 epochs); then CP 2's state of step 2 resumed on CP 4 (CP 1 on 2 ranks)."""
    data = work / "engine.jsonl"
    if runtime.is_main:
        rows = samples(97, ENGINE_LENGTHS)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dist.barrier()

    def run(name: str, cp: int, cap: int, **extra) -> tuple[list[float], dict]:
        args = TrainingArgs(
            model_name_or_path=str(work / "llama"), data_path=str(data),
            output_dir=str(work / name), batch_size=5, max_tokens_per_gpu=cap,
            context_parallel=cp, learning_rate=1e-3, save_final_checkpoint=True,
            save_dtype="float32", seed=3, training_mode="step", max_steps=4,
            defer_grad_sync=True, **extra,
        )  # fmt: skip
        assert train(args, runtime) == 0
        metrics = (work / name / "metrics.jsonl").read_text().splitlines()
        weights = load_file(work / name / "final" / "model.safetensors")
        return [json.loads(line)["loss"] for line in metrics], weights

    # CP under recomputation (the gather runs again in backward), states saved under CP
    got_losses, got = run("run_cp2", 2, 16, activation_checkpointing=True, save_every_steps=2)
    want_losses, want = run("run_cp1", 1, 32)
    if runtime.is_main:  # the CP 2 run as if stopped after its step-2 state
        shutil.copytree(work / "run_cp2", work / "resumed")
        for name in ("state/step_4", "final"):
            shutil.rmtree(work / "resumed" / name)
    dist.barrier()
    resume_cp = 4 if runtime.world_size % 4 == 0 else 1
    resumed_losses, resumed = run("resumed", resume_cp, 32 // resume_cp, resume=True,
                                  save_every_steps=2)  # fmt: skip
    assert len(got_losses) == len(want_losses) == len(resumed_losses) == 4

    def loss_error(losses):
        return max(abs(g - w) / abs(w) for g, w in zip(losses, want_losses, strict=True))

    return {
        "engine: 4 steps, exported weights": [loss_error(got_losses), worst_errors(got, want)],
        f"engine: CP 2's state resumed on CP {resume_cp}": [
            loss_error(resumed_losses),
            worst_errors(resumed, want),
        ],
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
