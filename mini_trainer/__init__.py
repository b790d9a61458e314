"""mini-trainer: fast full fine-tuning of causal LMs, with OSFT for continual learning.

`from mini_trainer import run_training, TrainingArgs, TorchrunArgs` is the Python API; the
names load lazily so that `import mini_trainer` stays cheap.
"""

import importlib
import logging

__version__ = "0.1.0"

QUIET_LIBRARY_LOGGERS = ("torchao", "torch.utils._pytree")
"""torchao (installed for `--optimizer adamw-8bit`) is imported by transformers whenever a model
is built; on a machine without CUDA its import warns that its CUDA kernels do not load, and
torch warns about its pytree registrations. Neither says anything about the run: only their
errors are shown, so a command's output is its own lines."""
for _name in QUIET_LIBRARY_LOGGERS:
    logging.getLogger(_name).setLevel(logging.ERROR)

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
