"""`mini-trainer evaluate`: held-out loss, perplexity, answer-token accuracy and exact match.

It reuses the training path wherever it can, so what trains also evaluates and the numbers mean
the same thing: the data is checked and indexed, and the model scored, by the evaluator core
that validation during training also runs (`training/evaluator.py`: `load_eval_dataset`,
`evaluate_loaded`); the model is `build_model`'s FSDP2-sharded `CausalLMWithLoss` (a world of
one without torchrun), built from a `ModelSpec` as training builds it, and never changed.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.errors import UserError
from mini_trainer.method import FullFineTuning
from mini_trainer.models.safetensors_file import check_weight_files
from mini_trainer.training.eval_stats import chunked_eval_stats
from mini_trainer.training.evaluator import evaluate_loaded, load_eval_dataset
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


# Kept alike on purpose: a parameter list of the loss's shape (paths, runtime, sizes).
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
