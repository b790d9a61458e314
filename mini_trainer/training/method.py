"""Which fine-tuning method a run uses: the registry's implementation, imported when asked.

Each method's option group (`mini_trainer/methods/`) names its `TrainingMethod` class by
`module:Class`; the class lives beside what it needs (full fine-tuning in
`mini_trainer/method.py`, with the protocol; OSFT in `osft/`), and only the training side
imports it, so checking the flags imports no torch and a method never imports the loop.
"""

from __future__ import annotations

import importlib

from mini_trainer.method import TrainingMethod
from mini_trainer.methods import method_group
from mini_trainer.training_args import TrainingArgs


def method_class(name: str) -> type:
    """The `TrainingMethod` class of registered method `name`."""
    module, _, attribute = method_group(name).implementation.partition(":")
    return getattr(importlib.import_module(module), attribute)


def make_method(args: TrainingArgs) -> TrainingMethod:
    """The method `--method` (or `--osft`) asks for, built from the run's arguments."""
    name = getattr(args, "method", None) or ("osft" if args.osft else "sft")
    return method_class(name)(args)
