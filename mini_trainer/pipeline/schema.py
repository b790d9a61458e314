"""The config's training options, generated from `TrainingArgs` (names, types, enums, bounds).

The config schema (`workflow/schemas/config.schema.yaml`, its `training_options` definition) and
the option table of `config/README.md` are written from the dataclass, between marker lines, so
a new `TrainingArgs` field becomes a config option by one command:

    python -m mini_trainer.pipeline.schema --write     # regenerate both files
    python -m mini_trainer.pipeline.schema --check     # exit 1 if either is stale

A test keeps the committed files equal to what this module generates.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from mini_trainer.training_args import TrainingArgs, _base_type

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = "workflow/schemas/config.schema.yaml"
README_FILE = "config/README.md"

SET_BY_PIPELINE = (
    "model_name_or_path",
    "data_path",
    "data_index",
    "output_dir",
    "learning_rate",
    "resume",
    "save_final_checkpoint",
    "osft_svd_cache",
    "ewc_fisher",  # the ewc_fisher rule's folder of the previous stage
    "wandb_run_name",
    "model_revision",  # the commit of the top-level `model_revision` (a Hub model)
    "validation_data_path",
    "save_best",
    "drop_states_after_final",  # from the top-level `keep_states_after_final`
)
"""TrainingArgs fields the pipeline sets itself (`layout.training_options`): not options."""

REFUSED_CHOICES = {"training_mode": ("infinite",)}
"""Values the engine takes that a pipeline job cannot use (an infinite job never finishes)."""

_BOUNDS = {
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusive_minimum": "exclusiveMinimum",
    "exclusive_maximum": "exclusiveMaximum",
}
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}

SCHEMA_BEGIN = "  # BEGIN training_options: generated from TrainingArgs by"
SCHEMA_END = "  # END training_options"
README_BEGIN = "<!-- BEGIN training options: generated from TrainingArgs by"
README_END = "<!-- END training options -->"
COMMAND = "`python -m mini_trainer.pipeline.schema --write`"


def option_fields() -> list[dataclasses.Field]:
    """The TrainingArgs fields that are config options, in the dataclass's order."""
    return [f for f in dataclasses.fields(TrainingArgs) if f.name not in SET_BY_PIPELINE]


def option_schema(f: dataclasses.Field) -> dict[str, Any]:
    """The JSON schema of one option: its type (or enum) and bounds, from the field.

    No `default`: Snakemake's validation would write it into the config, and with it into every
    run key; an option left out takes the engine's default at run time.
    """
    kind = _base_type(typing.get_type_hints(TrainingArgs)[f.name])
    meta = f.metadata
    out: dict[str, Any] = {}
    if "choices" in meta:
        refused = REFUSED_CHOICES.get(f.name, ())
        out["enum"] = [c for c in meta["choices"] if c not in refused]
    elif kind is list:
        out.update(type="array", minItems=1, items={"type": "string", "minLength": 1})
    else:
        out["type"] = _JSON_TYPES[kind]
    for name, keyword in _BOUNDS.items():
        if name in meta:
            out[keyword] = meta[name]
    return out


def training_options_schema() -> dict[str, Any]:
    """The `training_options` definition of the config schema."""
    return {
        "description": (
            "Flags of `mini-trainer train` (snake_case TrainingArgs fields), passed to every "
            "training job. An option left out takes the engine's default. The pipeline sets "
            f"{', '.join(SET_BY_PIPELINE)} itself, so they are not options here."
        ),
        "type": "object",
        "additionalProperties": False,
        "properties": {f.name: option_schema(f) for f in option_fields()},
    }


def render_schema_block() -> str:
    """The marked block of config.schema.yaml, indented under `$defs:`."""
    body = yaml.safe_dump(
        {"training_options": training_options_schema()},
        sort_keys=False,
        width=92,
        default_flow_style=None,
        allow_unicode=True,
    )
    lines = [f"{SCHEMA_BEGIN} {COMMAND}; do not edit"]
    lines += [f"  {line}" if line else line for line in body.splitlines()]
    lines.append(SCHEMA_END)
    return "\n".join(lines) + "\n"


def _default(f: dataclasses.Field) -> str:
    if "default_text" in f.metadata:
        return f"`{f.metadata['default_text']}`"
    value = f.default
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    return "—" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"


def render_readme_block() -> str:
    """The marked option table of config/README.md."""
    lines = [
        f"{README_BEGIN} {COMMAND} -->",
        "| option | engine default | allowed | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for f in option_fields():
        schema = option_schema(f)
        if "enum" in schema:
            allowed = ", ".join(f"`{c}`" for c in schema["enum"])
        else:
            allowed = schema["type"]
            bounds = [
                f"{sign} {schema[key]}"
                for key, sign in (
                    ("minimum", "≥"),
                    ("exclusiveMinimum", ">"),
                    ("maximum", "≤"),
                    ("exclusiveMaximum", "<"),
                )
                if key in schema
            ]
            if bounds:
                allowed += ", " + ", ".join(bounds)
        meaning = f.metadata["help"].replace("|", "\\|")
        lines.append(f"| `{f.name}` | {_default(f)} | {allowed} | {meaning} |")
    lines.append(README_END)
    return "\n".join(lines) + "\n"


def replace_block(text: str, begin: str, end: str, block: str, name: str) -> str:
    """`text` with the lines from the one starting with `begin` to `end` replaced by `block`."""
    pattern = re.compile(rf"^{re.escape(begin)}.*?^{re.escape(end)}[^\n]*\n", re.S | re.M)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{name}: expected one block marked {begin.strip()!r} ... {end!r}")
    return pattern.sub(lambda _: block, text)


def generated_files(root: Path = REPO_ROOT) -> dict[Path, str]:
    """Each generated file's path and the text it should have."""
    schema, readme = root / SCHEMA_FILE, root / README_FILE
    return {
        schema: replace_block(
            schema.read_text(), SCHEMA_BEGIN, SCHEMA_END, render_schema_block(), SCHEMA_FILE
        ),
        readme: replace_block(
            readme.read_text(), README_BEGIN, README_END, render_readme_block(), README_FILE
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mini_trainer.pipeline.schema", description=__doc__.split("\n\n")[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks")
    mode.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the checkout")
    args = parser.parse_args(argv)
    stale = [p for p, text in generated_files(args.root).items() if p.read_text() != text]
    if args.write:
        for path, text in generated_files(args.root).items():
            if path in stale:
                path.write_text(text)
                print(f"wrote {path}")
        return 0
    for path in stale:
        print(f"{path}: stale; run {COMMAND.strip('`')}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
