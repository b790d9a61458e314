"""The pipeline's errors (Snakemake prints them as one message, without a traceback) and the
`Config` type they describe; the bottom of `pipeline/`, so every module can name both."""

from __future__ import annotations

from typing import Any

from snakemake.exceptions import WorkflowError

Config = dict[str, Any]
"""The schema-validated Snakemake config (`workflow/schemas/config.schema.yaml`)."""


class PipelineError(WorkflowError):
    """A wildcard or target that the config does not define (Snakemake prints it, no trace)."""


class ConfigError(PipelineError):
    """A config problem, as one line: `config: KEY: reason` (or `FILE:LINE: reason`)."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.line = f"{key}: {reason}"

    def __str__(self) -> str:
        return self.line
