"""The options that several `mini-trainer` subcommands share, each defined once.

Each factory returns a click decorator; a subcommand passes only what differs (its help text,
a default), so a shared option is named, typed and checked the same way everywhere.
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from mini_trainer.errors import UserError
from mini_trainer.models.hub import resolve_once_per_node

FILE = click.Path(dir_okay=False, path_type=Path)
"""A file to write (its folder is created)."""
FOLDER = click.Path(file_okay=False, path_type=Path)
"""A folder to write."""
EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
"""A file that must exist (an input)."""


def model_options(help: str):
    """`--model` (a local folder, or a Hugging Face Hub id ORG/NAME) and `--model-revision`."""

    def decorate(command):
        command = click.option(
            "--model-revision", default="main", show_default=True, metavar="REV",
            help="Hub id only: branch, tag or commit; the commit it resolves to is recorded.",
        )(command)  # fmt: skip
        return click.option(
            "--model", required=True, metavar="FOLDER|ORG/NAME",
            help=help + " A local folder wins; else ORG/NAME is fetched into the HF cache.",
        )(command)  # fmt: skip

    return decorate


def resolve_model_option(model: str, revision: str, weights: bool = True) -> Path:
    """The local folder of a `--model` value (a Hub id is resolved once per node)."""
    return resolve_once_per_node(model, revision, weights).folder


def out_option(help: str, name: str = "--out", folder: bool = False, required: bool = True):
    """An output path option (`--out`, `--out-index`, ...): a file, or with `folder` a folder."""
    return click.option(name, required=required, type=FOLDER if folder else FILE, help=help)


def force_option(help: str):
    """`--force`: replace existing outputs (without it, an existing output is an error)."""
    return click.option("--force", is_flag=True, help=help)


def seed_option(help: str, default: int = 0):
    """`--seed`: what makes the command's random choices repeatable."""
    return click.option("--seed", type=int, default=default, show_default=True, help=help)


def on_long_option(help: str):
    """`--on-long error|drop`: what a sample over the length cap is."""
    return click.option(
        "--on-long",
        type=click.Choice(["error", "drop"]),
        default="error",
        show_default=True,
        help=help,
    )


def max_tokens_option(help: str, default: int | None = None):
    """`--max-tokens-per-gpu`: tokens per packed micro-batch per process (required when no
    default is given)."""
    # No `default=None` for the required form: click 8.3+ takes an explicit None as a default
    # given, and no longer asks for the option (validate then crashed on the missing cap).
    given_default = {} if default is None else {"default": default, "show_default": True}
    return click.option(
        "--max-tokens-per-gpu",
        required=default is None,
        type=click.IntRange(min=1),
        help=help,
        **given_default,
    )


class PositiveFinite(click.ParamType):
    """A number > 0 that is finite: click's `FloatRange(min=0, min_open=True)` takes `nan` (no
    comparison is true of it) and `inf`, which then crash or mislead the arithmetic. A bad
    value is a `UserError`: one line, exit status 2."""

    name = "float"

    def convert(self, value, param, ctx) -> float:
        flag = param.opts[0] if param is not None else "value"
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            raise UserError(f"{flag}: {value!r} is not a finite number above 0")
        return number


POSITIVE_FINITE = PositiveFinite()
