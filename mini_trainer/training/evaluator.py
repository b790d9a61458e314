"""The evaluator core: one eval file checked and indexed, and a built model scored on it.

Shared by `mini-trainer evaluate` (`evaluate/runner.py`, which builds the model from a folder)
and validation during training (`training/validation.py`, which scores the training model
itself), so `val_loss` at step K is what `mini-trainer evaluate` says of the checkpoint exported
at step K. It lives in `training/` because the training loop uses it and `training/` imports
nothing from `evaluate/`: the command sits above it.

- the data is checked by `validate.build_index` (same checks, same `FILE:LINE: FIELD: reason`
  errors) with the token cap as the cap;
- the whole eval set is one "global batch" for `plan_step` (the LPT planner): packed,
  padding-free micro-batches, balanced across ranks, each collated by `collate_packed`, so the
  target of position t is `labels[t + 1]` of the same sample and no sample sees another;
- each call is handed `chunked_eval_stats` (`eval_stats.py`), bound to its micro-batch's
  samples, as its loss: the logits of the whole row never exist, and the model is never changed.
Each rank sums its micro-batches; one all-reduce gives the totals.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import numpy as np
import torch

from mini_trainer.batching.collator import collate_packed, plan_step
from mini_trainer.data.dataset import IndexedJsonlDataset
from mini_trainer.data.validate import build_index, read_vocab_size
from mini_trainer.distributed.runtime import (
    Runtime,
    all_reduce_max,
    all_reduce_sum,
    decided_on_main,
)
from mini_trainer.training.eval_stats import chunked_eval_stats, sample_ids_of

EVAL_LONG_HINT = (
    "samples longer than {flag}: {count}; raise {flag} to at least "
    "the longest (an evaluation scores every sample: none is left out)"
)
"""The remedy for over-long samples here: validate's (--on-long drop) is no option of evaluate."""


def load_eval_dataset(
    data_path: Path, model_path: Path, max_tokens: int, runtime: Runtime,
    flag: str = "--max-tokens-per-gpu",
):  # fmt: skip
    """Rank 0 validates the file exactly as `mini-trainer validate` does; every rank gets it.
    `flag` is the option that set `max_tokens`, which an over-long sample's advice names."""
    vocab_size = read_vocab_size(model_path)
    hint = EVAL_LONG_HINT.replace("{flag}", flag)

    def index_on_main():
        return build_index(data_path, vocab_size, max_tokens, long_hint=hint,
                           outcome=None, cap_flag=flag)[0]  # fmt: skip

    return IndexedJsonlDataset(data_path, decided_on_main(index_on_main, runtime), vocab_size)


def evaluate_loaded(
    model, dataset, runtime: Runtime, max_tokens_per_gpu: int, pad_id: int, stats_fn=None
) -> dict:
    """The metrics of an already built (sharded) `model` on `dataset`, the same on every rank.

    This is the evaluator, shared by `mini-trainer evaluate` and validation during training
    (`training/validation.py`): samples are split over the ranks by tokens (`plan_step`), each
    rank sums its micro-batches, and one all-reduce gives the totals. Each micro-batch's call
    gets `stats_fn` (default `chunked_eval_stats`) as its loss, bound to that micro-batch's
    samples; the model itself, its own loss included, is left as it was. Runs under
    `no_grad`; the caller sets eval mode.
    """
    stats_fn = stats_fn or chunked_eval_stats
    plan = plan_step(
        np.arange(len(dataset)),
        dataset.lengths,
        dataset.loss_tokens,
        runtime.world_size,
        max_tokens_per_gpu,
    )

    started = time.perf_counter()
    loss_sum = 0.0
    correct = exact = loss_tokens = 0
    with torch.no_grad():
        for ranks in plan.micro_batches:
            samples = [dataset[i] for i in ranks[runtime.rank]]
            micro = collate_packed(samples, plan.batch_num_loss_tokens, pad_id).to(runtime.device)
            lengths = [len(s["input_ids"]) for s in samples] or [micro.input_ids.shape[1]]
            # The loss function sees flattened positions only; bind which sample each one is.
            stats = functools.partial(
                stats_fn,
                sample_ids=sample_ids_of(lengths, runtime.device),
                num_samples=len(lengths),
            )
            sums = model(micro.input_ids, micro.position_ids, micro.target_ids, loss_fn=stats)
            loss_sum += sums.loss_sum.item()
            correct += sums.num_correct
            loss_tokens += sums.num_loss_tokens
            exact += int(sums.sample_all_correct[: len(samples)].sum())
    elapsed = time.perf_counter() - started
    totals = all_reduce_sum([loss_sum, correct, exact, loss_tokens], runtime)
    (elapsed,) = all_reduce_max([elapsed], runtime)
    loss_sum, correct, exact, loss_tokens = totals[0], *map(round, totals[1:])
    if loss_tokens != plan.batch_num_loss_tokens:  # every sample counted exactly once
        raise RuntimeError(
            f"evaluated {loss_tokens} loss tokens, the index has {plan.batch_num_loss_tokens}"
        )
    loss = loss_sum / loss_tokens
    return {
        "num_samples": plan.num_samples,
        "num_tokens": plan.num_tokens,
        "num_loss_tokens": loss_tokens,
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "token_accuracy": correct / loss_tokens,
        "exact_match": exact / plan.num_samples,
        "num_correct_tokens": correct,
        "num_exact_samples": exact,
        "max_tokens_per_gpu": max_tokens_per_gpu,
        "num_micro_batches": plan.num_micro_batches,
        "world_size": runtime.world_size,
        "device": runtime.device.type,
        "elapsed_s": elapsed,
        "tokens_per_second": plan.num_tokens / elapsed if elapsed > 0 else None,
    }
