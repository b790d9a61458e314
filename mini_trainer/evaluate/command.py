"""The `evaluate` subcommand's body: check, evaluate on every rank, write one JSON on rank 0.

Works as a plain process (a world of one) and under torchrun:
`torchrun --nproc-per-node N -m mini_trainer evaluate --model M --data D --out F.json`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch.distributed as dist

from mini_trainer.data.outputs import check_outputs
from mini_trainer.distributed.runtime import decided_on_main, init_runtime, shutdown
from mini_trainer.errors import UserError
from mini_trainer.evaluate.lm_eval_tasks import parse_task_list, run_lm_eval, task_manager
from mini_trainer.evaluate.runner import check_inputs, evaluate_model
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.models.hub import hub_source
from mini_trainer.versions import package_versions, source_commit

log = logging.getLogger("mini_trainer")


def run_evaluate(
    model: Path,
    data: Path,
    out: Path,
    max_tokens_per_gpu: int,
    lm_eval_tasks: str | None = None,
    lm_eval_include: Path | None = None,
    lm_eval_batch_size: int = 8,
    lm_eval_limit: int | None = None,
    force: bool = False,
) -> dict:
    """Evaluate `model` on `data` (and harness tasks); write `out` atomically; return the dict."""
    check_outputs({"--out": out}, [data], force)
    check_inputs(model, data)
    tasks = parse_task_list(lm_eval_tasks)
    if lm_eval_include is not None and not tasks:
        raise UserError("--lm-eval-include: needs --lm-eval-tasks")
    manager = None
    if tasks and int(os.environ.get("RANK", "0")) == 0:  # only rank 0 runs the harness
        manager = task_manager(tasks, lm_eval_include)  # bad tasks fail now, not after the eval

    runtime = init_runtime()
    try:
        result = _evaluate(runtime, model, data, max_tokens_per_gpu)
        if tasks:  # only rank 0 runs the harness; every rank gets its scores or its error
            result["lm_eval"] = decided_on_main(
                lambda: run_lm_eval(
                    model, tasks, manager, str(runtime.device), lm_eval_batch_size, lm_eval_limit
                ),
                runtime,
            )
        if runtime.is_main:
            _write(out, result)
        dist.barrier()  # no rank exits before the file is there
        return result
    finally:
        shutdown()


def _evaluate(runtime, model: Path, data: Path, max_tokens_per_gpu: int) -> dict:
    result = evaluate_model(model, data, runtime, max_tokens_per_gpu)
    if source := hub_source(model):  # a Hub model: which commit was evaluated
        result["model_hub_id"], result["model_commit"] = source["hub_id"], source["commit"]
    result["versions"] = package_versions()
    result["git_commit"] = source_commit()
    result["timestamp"] = time.time()
    return result


def _write(out: Path, result: dict) -> None:
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    log.info("wrote %s", out)


def summary_line(result: dict) -> str:
    """One human line for stdout."""
    return (
        f"{result['data']}: {result['num_samples']:,} samples, "
        f"{result['num_loss_tokens']:,} answer tokens: loss {result['loss']:.4f}, "
        f"perplexity {result['perplexity']:.3f}, token accuracy {result['token_accuracy']:.2%}, "
        f"exact match {result['exact_match']:.2%}"
    )
