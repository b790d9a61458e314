"""Validation during training: held-out metrics every N steps, the best step, early stopping.

- The options' rules (`VAL_METRICS`, `validation_problems`, `validation_warnings`) live in
  `mini_trainer/validation_options.py`, which `TrainingArgs` checks before any process starts.
- `BestTracker`: the best value and step so far and the patience counter; pure, and its
  `state_dict` is saved with the trainer state, so a resumed run decides as an uninterrupted one.
- `Validator`: what the loop calls after each step. It scores the training model itself with
  `training/evaluator.py`'s `evaluate_loaded`, the evaluator of `mini-trainer evaluate` (samples
  split over the ranks by tokens, sums reduced once), so `val_loss` at step K is what
  `mini-trainer evaluate` says of the checkpoint exported at step K.

Validation changes nothing else: it draws no random number, never touches the sampler, runs
under `no_grad` in eval mode (no dropout state advances), hands its statistics to each call
as the loss (the model's own loss is never touched) and puts the model's mode back as it was,
so a run ends with the same weights with or without it.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from mini_trainer.training.evaluator import evaluate_loaded, load_eval_dataset
from mini_trainer.validation_options import VAL_METRICS

log = logging.getLogger("mini_trainer")

VAL_ROW_FIELDS = (*VAL_METRICS, "val_tokens", "val_time_s")
"""What a validation step adds to its metrics.jsonl row."""

BEST_DIR = "best"
BEST_METADATA = "best_checkpoint.json"
"""Written inside `OUT/best/`: the step, the metric and its value."""


def validation_due(step: int, every: int | None, is_last: bool) -> bool:
    """Validate after step `step`: every `every` steps, and always after the last one."""
    return is_last or bool(every) and step % every == 0


@dataclass
class BestTracker:
    """The best validation value so far, its step, and validations without an improvement.

    A value improves on the best when it is better by more than `min_delta` (lower for "min"
    metrics, higher for "max"); the first value always does. With `patience`, the run should
    stop once `patience` validations in a row have not improved.
    """

    mode: str = "min"
    min_delta: float = 0.0
    patience: int | None = None
    best_value: float | None = None
    best_step: int | None = None
    bad_validations: int = 0

    def update(self, step: int, value: float) -> bool:
        """Record the value measured at `step`; True when it is the new best."""
        if self.improves(value):
            self.best_value, self.best_step, self.bad_validations = value, step, 0
            return True
        self.bad_validations += 1
        return False

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        if self.mode == "min":
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_validations >= self.patience

    def best_text(self) -> str:
        if self.best_value is None:
            return "none yet (no finite value)"
        return f"{self.best_value:.6g} at step {self.best_step}"

    def state_dict(self) -> dict:
        return {"best_value": self.best_value, "best_step": self.best_step,
                "bad_validations": self.bad_validations}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.best_value = state["best_value"]
        self.best_step = state["best_step"]
        self.bad_validations = int(state["bad_validations"])


def val_row(result: dict) -> dict:
    """The metrics.jsonl fields of one `evaluate_loaded` result."""
    return {
        "val_loss": result["loss"],
        "val_perplexity": result["perplexity"],
        "val_token_accuracy": result["token_accuracy"],
        "val_exact_match": result["exact_match"],
        "val_tokens": result["num_tokens"],
        "val_time_s": result["elapsed_s"],
    }


class Validator:
    """Validation as the loop sees it: `after_step` after every optimizer step.

    Built in the data phase (so a bad validation file fails before the model loads); its
    `state_dict` goes into the trainer state.
    """

    def __init__(self, args, runtime):
        self.args = args
        self.runtime = runtime
        self.max_tokens = args.validation_max_tokens_per_gpu or args.max_tokens_per_gpu
        self.dataset = load_eval_dataset(
            Path(args.validation_data_path), Path(args.model_name_or_path), self.max_tokens,
            runtime, "--validation-max-tokens-per-gpu",
        )  # fmt: skip
        self.tracker = BestTracker(
            mode=VAL_METRICS[args.best_metric],
            min_delta=args.early_stopping_min_delta,
            patience=args.early_stopping_patience,
        )

    @property
    def should_stop(self) -> bool:
        return self.tracker.should_stop

    def state_dict(self) -> dict:
        return {"metric": self.args.best_metric, **self.tracker.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        """Restore the tracker; a state saved without validation (or another metric) starts
        the tracking afresh."""
        if state and state.get("metric") == self.args.best_metric:
            self.tracker.load_state_dict(state)

    def after_step(self, model, pad_id: int, step: int, is_last: bool, export) -> dict:
        """Validate when due; export `best/` on an improvement (with `--save-best`).

        Returns the row fields to log (empty when not due). `export(name, extra_json)` writes
        an HF folder as the loop's own exports do.
        """
        if not validation_due(step, self.args.validation_every_steps, is_last):
            return {}
        row = val_row(self.evaluate(model, pad_id))
        value = row[self.args.best_metric]
        if self.tracker.update(step, value) and self.args.save_best:
            meta = {"step": step, "metric": self.args.best_metric, "value": value, **row}
            export(BEST_DIR, {BEST_METADATA: meta})
        if self.runtime.is_main:
            log.info(
                "validation at step %d: %s; best %s %s",
                step, " ".join(f"{k} {row[k]:.6g}" for k in VAL_METRICS), self.args.best_metric,
                self.tracker.best_text(),
            )  # fmt: skip
            if self.should_stop:
                log.info(
                    "early stopping after step %d: %s has not improved by more than %g in %d "
                    "validations (best %s)",
                    step, self.args.best_metric, self.args.early_stopping_min_delta,
                    self.tracker.bad_validations, self.tracker.best_text(),
                )  # fmt: skip
        return row

    def evaluate(self, model, pad_id: int) -> dict:
        """`evaluate_loaded` on the training model; its mode put back."""
        was_training = model.training
        model.eval()
        try:
            return evaluate_loaded(model, self.dataset, self.runtime, self.max_tokens, pad_id)
        finally:
            model.train(was_training)


def best_metadata(best_dir: Path) -> dict:
    """The metadata `--save-best` wrote into `best_dir`."""
    return json.loads((best_dir / BEST_METADATA).read_text())
