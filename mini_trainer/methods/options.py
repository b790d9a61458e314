"""What a training method's option group is: its flags, checks, fingerprint and plan terms.

A method owns one option group, a dataclass mixin in its own module of this package
(`sft.py`, `osft.py`, `ewc.py`, ...). `TrainingArgs` inherits every registered group, so each
group's fields are `--kebab-case` flags of `mini-trainer train`, `run_training()` fields and
pipeline `training:` options like any other, with their help, defaults and bounds in the field
metadata (`option`). The group also decides, for its own fields only:

- `method_problems(selected)`: the checks of its options (and that they are not given to another
  method);
- `fingerprint_terms()`: what of them makes a run the run it is, compared on `--resume`;
- `plan_terms()`: what `mini-trainer plan` shows of the method;
- `label`: the method's name in the report.

No torch here: the flags are checked before any process starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar


def option(default: Any = dataclasses.MISSING, help: str = "", **kwargs: Any) -> Any:
    """A dataclass field whose help text becomes the CLI flag's help.

    Other metadata: `nargs`; `negatable` (a bool with a `--no-` flag too, its default None:
    neither given) and `default_text` (the default in words, for `--help` and the config's
    table); `choices` and the bounds `minimum`, `maximum`, `exclusive_minimum`,
    `exclusive_maximum`, which the pipeline's config schema is generated from
    (`python -m mini_trainer.pipeline.schema --write`) and a test checks the checks enforce.
    """
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kwargs})
    return field(default=default, metadata={"help": help, **kwargs})


def flag(name: str) -> str:
    """`osft_rank_mode` -> `osft-rank-mode` (without the dashes)."""
    return name.replace("_", "-")


@dataclass
class MethodOptions:
    """Base of every method's option group (a mixin of `TrainingArgs`; no fields of its own)."""

    name: ClassVar[str]
    """The method's name: `--method NAME`, and `method:` of a pipeline `methods:` entry."""
    label: ClassVar[str]
    """The method's name on the report's page."""
    implementation: ClassVar[str]
    """`module:Class` of its `TrainingMethod` (imported by `training/method.py` when a run
    starts, so checking the flags imports no torch)."""
    legacy_fingerprint: ClassVar[bool] = False
    """Its options are in every run's fingerprint, selected or not (OSFT's, for old states)."""
    needs: ClassVar[str] = ""
    """The flag an option of this group needs, for its messages (default: `--method NAME`)."""

    @classmethod
    def own_fields(cls) -> list[dataclasses.Field]:
        """The fields this group declares (not its bases')."""
        own = cls.__dict__.get("__annotations__", {})
        return [f for f in dataclasses.fields(cls) if f.name in own]

    @classmethod
    def needs_flag(cls) -> str:
        return cls.needs or f"--method {cls.name}"

    @classmethod
    def given(cls, args) -> list[str]:
        """This group's options that `args` (a `TrainingArgs`) sets to other than defaults."""
        out = []
        for f in cls.own_fields():
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            if getattr(args, f.name) != default:
                out.append(f.name)
        return out

    @classmethod
    def method_problems(cls, args, selected: bool) -> Iterator[str]:
        """One line per problem of this group's options in `args`; `selected`: the run uses
        this method. By default: its options given to another method are refused."""
        if not selected:
            for name in cls.given(args):
                yield f"--{flag(name)}: needs {cls.needs_flag()}"

    @classmethod
    def fingerprint_terms(cls, args) -> dict[str, Any]:
        """The options that make a run of this method the run it is (compared on `--resume`).
        By default the method's name and every option given (left out at their defaults, so a
        state saved before an option existed still resumes)."""
        return {"method": cls.name, **{n: getattr(args, n) for n in cls.given(args)}}

    @classmethod
    def may_change_on_resume(cls) -> tuple[str, ...]:
        """Options (paths) whose content `fingerprint_terms` covers instead of their value."""
        return ()

    @classmethod
    def plan_terms(cls, args) -> dict[str, Any]:
        """What `mini-trainer plan` reports of the method's options (JSON values), beside its
        name."""
        return {}
