"""The validation options' rules: which metrics `--best-metric` may name, and the cross-field
checks `TrainingArgs` applies to the validation flags. Kept apart from training/validation.py
(the validator itself) so that reading the options (the CLI, the pipeline's config check, the
Slurm launcher, the report) imports nothing of the training package."""

from __future__ import annotations

import filecmp
import math
from pathlib import Path

VAL_METRICS = {
    "val_loss": "min",
    "val_perplexity": "min",
    "val_token_accuracy": "max",
    "val_exact_match": "max",
}
"""Metrics `--best-metric` may name, and which way is better."""


def validation_problems(args) -> list[str]:
    """Rule violations of the validation options (one line each)."""
    problems = []
    if args.validation_data_path is None:
        defaults = {
            "save_best": False,
            "best_metric": "val_loss",
            "early_stopping_patience": None,
            "early_stopping_min_delta": 0.0,
            "validation_every_steps": None,
            "validation_max_tokens_per_gpu": None,
        }
        for name, default in defaults.items():
            if getattr(args, name) != default:
                problems.append(f"--{_flag(name)}: needs --validation-data-path")
        return problems
    for name in ("validation_every_steps", "validation_max_tokens_per_gpu"):
        value = getattr(args, name)
        if value is not None and value < 1:
            problems.append(f"--{_flag(name)}: must be at least 1, got {value}")
    if args.best_metric not in VAL_METRICS:
        problems.append(
            f"--best-metric: unknown value {args.best_metric!r} (one of {', '.join(VAL_METRICS)})"
        )
    patience = args.early_stopping_patience
    if patience is not None and patience < 1:
        problems.append(f"--early-stopping-patience: must be at least 1, got {patience}")
    delta = args.early_stopping_min_delta
    if not (delta >= 0 and math.isfinite(delta)):
        problems.append(f"--early-stopping-min-delta: must be a finite number >= 0, got {delta}")
    return problems


def validation_warnings(args) -> list[str]:
    """Legal but probably unintended validation settings."""
    path = args.validation_data_path
    if path is None:
        return []
    same = Path(path).resolve() == Path(args.data_path).resolve()
    if not same and Path(path).is_file() and Path(args.data_path).is_file():
        same = filecmp.cmp(path, args.data_path, shallow=False)
    if same:
        return [
            f"{path}: --validation-data-path is the training file: validation metrics will "
            "measure fit to the training data, not generalization"
        ]
    return []


def _flag(name: str) -> str:
    return name.replace("_", "-")
