"""`mini-trainer evaluate`: held-out loss, perplexity, answer-token accuracy and exact match.

It reuses the training path wherever it can, so what trains also evaluates and the numbers mean
the same thing:
- the data is checked by `validate.build_index` (same checks, same `FILE:LINE: FIELD: reason`
  errors) with `--max-tokens-per-gpu` as the cap;
- the whole eval set is one "global batch" for `plan_step` (the LPT planner): packed,
  padding-free micro-batches, balanced across ranks, each collated by `collate_packed`, so the
  target of position t is `labels[t + 1]` of the same sample and no sample sees another;
- the model is `build_model`'s FSDP2-sharded `CausalLMWithLoss` (a world of one without
  torchrun), built from a `ModelSpec` as training builds it; each call is handed
  `chunked_eval_stats`, bound to its micro-batch's samples, as its loss: the logits of the
  whole row never exist, and the model is never changed.
Each rank sums its micro-batches; one all-reduce gives the totals.
"""

from __future__ import annotations

import functools
import logging
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
from mini_trainer.errors import UserError
from mini_trainer.evaluate.stats import chunked_eval_stats, sample_ids_of
from mini_trainer.method import FullFineTuning
from mini_trainer.models.safetensors_file import check_weight_files
from mini_trainer.training.model_setup import ModelSpec, build_model

log = logging.getLogger("mini_trainer")

DEFAULT_MAX_TOKENS = 8192
"""Tokens per packed micro-batch per rank when `--max-tokens-per-gpu` is not given."""


def check_inputs(model_path: Path, data_paths: list[Path]) -> None:
    """Problems found before any process group or model exists."""
    problems = []
    if not model_path.is_dir():
        problems.append(f"{model_path}: --model: no such model folder")
    problems += [f"{path}: --data: no such file" for path in data_paths if not path.is_file()]
    if problems:
        raise UserError(*problems)
    check_weight_files(model_path)


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


def evaluate_model(
    model_path: Path,
    data_path: Path,
    runtime: Runtime,
    max_tokens_per_gpu: int = DEFAULT_MAX_TOKENS,
    chunk_size: int | None = None,
) -> dict:
    """The metrics of `model_path` on `data_path`, the same dict on every rank."""
    return evaluate_files(model_path, [data_path], runtime, max_tokens_per_gpu, chunk_size)[0]


def evaluate_files(
    model_path: Path,
    data_paths: list[Path],
    runtime: Runtime,
    max_tokens_per_gpu: int = DEFAULT_MAX_TOKENS,
    chunk_size: int | None = None,
) -> list[dict]:
    """The metrics of `model_path` on each of `data_paths`, in order, the same on every rank.

    The model is built once for all of them (a process start and a model load per file were
    most of an evaluation of a small model); every file is checked before the model loads.
    """
    datasets = [
        load_eval_dataset(data_path, model_path, max_tokens_per_gpu, runtime)
        for data_path in data_paths
    ]
    stats_fn = chunked_eval_stats
    if chunk_size is not None:
        stats_fn = functools.partial(chunked_eval_stats, chunk_size=chunk_size)
    # No loss of its own: every call below passes the statistics as its loss.
    model, config = build_model(ModelSpec(str(model_path)), None, runtime, FullFineTuning())
    model.eval()
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    return [
        {
            "model": str(model_path),
            "data": str(data_path),
            **evaluate_loaded(model, dataset, runtime, max_tokens_per_gpu, pad_id, stats_fn),
        }
        for data_path, dataset in zip(data_paths, datasets, strict=True)
    ]


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
