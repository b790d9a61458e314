"""mini-trainer: fast full fine-tuning of causal LMs, with OSFT for continual learning.

`from mini_trainer import run_training, TrainingArgs, TorchrunArgs` is the Python API; the
names load lazily so that `import mini_trainer` stays cheap.
"""

__version__ = "0.1.0"

__all__ = ["TorchrunArgs", "TrainingArgs", "TrainingFailed", "run_training", "__version__"]


def __getattr__(name: str):
    if name in ("run_training", "TrainingFailed"):
        # deferred: every submodule import runs this file; the API loads on first use
        from mini_trainer import api_train

        return getattr(api_train, name)
    if name == "TrainingArgs":
        # deferred: as above
        from mini_trainer.training_args import TrainingArgs

        return TrainingArgs
    if name == "TorchrunArgs":
        # deferred: as above
        from mini_trainer.launch_args import TorchrunArgs

        return TorchrunArgs
    raise AttributeError(f"module 'mini_trainer' has no attribute {name!r}")
