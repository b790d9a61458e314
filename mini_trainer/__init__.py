"""mini-trainer: fast full fine-tuning of causal LMs, with OSFT for continual learning.

`from mini_trainer import run_training, TrainingArgs, TorchrunArgs` is the Python API; the
names load lazily so that `import mini_trainer` stays cheap.
"""

import importlib

__version__ = "0.1.0"

__all__ = ["TorchrunArgs", "TrainingArgs", "TrainingFailed", "run_training", "__version__"]


_LAZY = {
    "run_training": "api_train",
    "TrainingFailed": "api_train",
    "TrainingArgs": "training_args",
    "TorchrunArgs": "launch_args",
}
"""Each public name and the submodule it loads from, on first use."""


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"mini_trainer.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'mini_trainer' has no attribute {name!r}")
