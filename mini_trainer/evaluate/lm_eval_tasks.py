"""`--lm-eval-tasks`: lm-evaluation-harness tasks on a checkpoint, through the `eval` extra.

The harness loads the Hugging Face folder itself (its own `HFLM` wrapper), on one process: under
torchrun only rank 0 runs it. It runs offline by default (`HF_HUB_OFFLINE=1`,
`HF_DATASETS_OFFLINE=1` unless already set), so a task must find its data locally: a task YAML
of your own (`dataset_path: json`, `dataset_kwargs.data_files` with absolute paths) in a folder
given with `--lm-eval-include`, or a dataset already in the Hugging Face cache.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from mini_trainer.errors import UserError

log = logging.getLogger("mini_trainer")

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def parse_task_list(text: str | None) -> list[str]:
    """`"a, b"` -> `["a", "b"]`; empty names are an error."""
    if text is None:
        return []
    tasks = [name.strip() for name in text.split(",")]
    if not all(tasks):
        raise UserError(f"--lm-eval-tasks: {text!r}: empty task name (expected a,b,c)")
    return tasks


def import_lm_eval():
    """The `lm_eval` module, or a UserError that names the extra to install."""
    try:
        # deferred: optional dependency (the eval extra)
        import lm_eval
        from lm_eval import evaluator  # noqa: F401
    except ImportError as error:
        raise UserError(
            f"--lm-eval-tasks: lm_eval is not installed ({error}); "
            "install it with: pip install 'mini-trainer[eval]'"
        ) from None
    return lm_eval


def _plain(value):
    """JSON-safe copy of a harness result value (numpy scalars, NaN, nested dicts)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def task_manager(tasks: list[str], include_path: Path | None):
    """A harness `TaskManager` that knows every task in `tasks`, or a UserError naming the rest.

    Indexing the harness's own ~15,000 task files takes half a minute, so when every task is
    found in `include_path` alone, the built-in ones are not indexed at all.
    """
    for name in OFFLINE_VARIABLES:
        os.environ.setdefault(name, "1")
    import_lm_eval()
    # deferred: optional dependency (the eval extra)
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        if not include_path.is_dir():
            raise UserError(f"{include_path}: --lm-eval-include: no such folder")
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if all(task in local.all_tasks for task in tasks):
            return local
    manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        where = f" (looked in {include_path} and the harness's own tasks)" if include_path else ""
        raise UserError(f"--lm-eval-tasks: unknown task {', '.join(unknown)}{where}")
    return manager


def run_lm_eval(
    model_path: Path,
    tasks: list[str],
    manager,
    device: str = "cpu",
    batch_size: int = 8,
    limit: int | None = None,
) -> dict:
    """`{task: {metric: value, ...}}` for each task (groups give their subtasks too).

    `manager` comes from `task_manager(tasks, ...)`.
    """
    # deferred: optional dependency (the eval extra)
    from lm_eval import evaluator

    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    try:
        results = evaluator.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(model_path), "dtype": dtype},
            tasks=tasks,
            batch_size=batch_size,
            device=device,
            limit=limit,
            task_manager=manager,
            log_samples=False,
        )
    except (OSError, ValueError, ConnectionError) as error:
        # Offline and the task's dataset is not local: the harness's error says which.
        raise UserError(f"--lm-eval-tasks: {', '.join(tasks)}: {error}") from None
    if results is None:  # only non-zero ranks of the harness's own launcher get None
        return {}
    out = {task: _plain(metrics) for task, metrics in results["results"].items()}
    for task, count in (results.get("n-samples") or {}).items():
        if task in out and isinstance(count, dict):
            out[task]["num_samples"] = _plain(count.get("effective", count.get("original")))
    return out
