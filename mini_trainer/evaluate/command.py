"""The `evaluate` subcommand's body: check, evaluate on every rank, write one JSON per data
file on rank 0.

Works as a plain process (a world of one) and under torchrun:
`torchrun --nproc-per-node N -m mini_trainer evaluate --model M --data D --out F.json`.
Several `--data D --out F.json` pairs share one process and one model load.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch.distributed as dist

from mini_trainer.data.outputs import check_outputs
from mini_trainer.distributed.env import env_world
from mini_trainer.distributed.runtime import decided_on_main, init_runtime, shutdown
from mini_trainer.errors import UserError
from mini_trainer.evaluate.lm_eval_tasks import parse_task_list, run_lm_eval, task_manager
from mini_trainer.evaluate.runner import check_inputs, evaluate_files
from mini_trainer.io_utils import atomic_write_text
from mini_trainer.models.hub import hub_source
from mini_trainer.versions import package_versions, source_commit


def run_evaluate(
    model: Path,
    pairs: list[tuple[Path, Path]],
    max_tokens_per_gpu: int,
    lm_eval_tasks: str | None = None,
    lm_eval_include: Path | None = None,
    lm_eval_batch_size: int = 8,
    lm_eval_limit: int | None = None,
    force: bool = False,
) -> list[dict]:
    """Evaluate `model` on each (data, out) pair (and the harness tasks, once); write each out
    atomically; return the dicts in order. Every check runs before any work: a bad pair writes
    nothing at all."""
    datas, outs = [data for data, _ in pairs], [out for _, out in pairs]
    names = ["--out"] if len(outs) == 1 else [f"--out #{i}" for i in range(1, len(outs) + 1)]
    check_outputs(dict(zip(names, outs, strict=True)), datas, force)
    check_inputs(model, datas)
    tasks = parse_task_list(lm_eval_tasks)
    if lm_eval_include is not None and not tasks:
        raise UserError("--lm-eval-include: needs --lm-eval-tasks")
    manager = None
    if tasks and env_world()[0] == 0:  # only rank 0 runs the harness
        manager = task_manager(tasks, lm_eval_include)  # bad tasks fail now, not after the eval

    runtime = init_runtime()
    try:
        metrics = evaluate_files(model, datas, runtime, max_tokens_per_gpu)
        results = [_provenance(model, result) for result in metrics]
        if tasks:  # only rank 0 runs the harness; every rank gets its scores or its error
            scores = decided_on_main(
                lambda: run_lm_eval(
                    model, tasks, manager, str(runtime.device), lm_eval_batch_size, lm_eval_limit
                ),
                runtime,
            )
            for result in results:  # the model's harness scores, beside each file's metrics
                result["lm_eval"] = scores
        if runtime.is_main:
            for out, result in zip(outs, results, strict=True):
                _write(out, result)
        dist.barrier()  # no rank exits before the files are there
        return results
    finally:
        shutdown()


def _provenance(model: Path, result: dict) -> dict:
    if source := hub_source(model):  # a Hub model: which commit was evaluated
        result["model_hub_id"], result["model_commit"] = source["hub_id"], source["commit"]
    result["versions"] = package_versions()
    result["git_commit"] = source_commit()
    result["timestamp"] = time.time()
    return result


def _write(out: Path, result: dict) -> None:
    # Not logged: the command reports each file it wrote (once, on rank 0).
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")


def summary_line(result: dict) -> str:
    """One human line for stdout."""
    return (
        f"{result['data']}: {result['num_samples']:,} samples, "
        f"{result['num_loss_tokens']:,} answer tokens: loss {result['loss']:.4f}, "
        f"perplexity {result['perplexity']:.3f}, token accuracy {result['token_accuracy']:.2%}, "
        f"exact match {result['exact_match']:.2%}"
    )
