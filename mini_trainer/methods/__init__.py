"""Training methods by name: each method's option group, and the registry of them.

`--method NAME` (a pipeline `methods:` entry's `method:`, `TrainingArgs(method=...)`) picks one
registered method. A method owns its option group in its own module here (names, defaults,
checks, fingerprint and plan terms, report label: `options.MethodOptions`) and its hooks in its
implementation module (`MethodOptions.implementation`). Adding a method is its two modules, one
line in `REGISTERED` below, and its tests (docs/architecture.md).
"""

from __future__ import annotations

from mini_trainer.methods.ewc import EWCOptions
from mini_trainer.methods.lwf import LwFOptions
from mini_trainer.methods.options import MethodOptions
from mini_trainer.methods.osft import OSFTOptions
from mini_trainer.methods.sft import SFTOptions

REGISTERED: tuple[type[MethodOptions], ...] = (
    SFTOptions,
    OSFTOptions,
    EWCOptions,
    LwFOptions,
)
"""Every method, in the order `--help` and the report list them."""

METHODS: dict[str, type[MethodOptions]] = {group.name: group for group in REGISTERED}
METHOD_NAMES = tuple(METHODS)


def method_group(name: str) -> type[MethodOptions]:
    """The option group of method `name` (a KeyError names the registered ones)."""
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r} (one of {', '.join(METHOD_NAMES)})") from None


def method_label(name: str) -> str:
    """The report's name of a registered method; `name` itself for anything else."""
    group = METHODS.get(name)
    return group.label if group else name
