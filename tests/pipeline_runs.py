"""Pipeline runs shared by several test modules, made at most once per test session.

`full_run`: the whole demo DAG (three methods, a chat task, two stages, evaluation, manifest,
report) in a temporary copy of the workflow. tests/test_pipeline.py checks what it wrote;
tests/test_report.py opens its report page in a browser. Session scope, so the suite runs the
pipeline once for both.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def full_run(tmp_path_factory):
    # The workflow helpers live with the pipeline tests (pytest imports that module by name).
    from test_pipeline import _full_config, _write_chat_task, check, make_workdir, snakemake

    workdir = make_workdir(tmp_path_factory.mktemp("full"), _full_config())
    _write_chat_task(workdir)
    check(snakemake(workdir, "--cores", "2"))
    return workdir
