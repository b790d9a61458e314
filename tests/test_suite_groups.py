"""The README's test command (`-n 3 --dist loadgroup`) relies on xdist groups: every test that
uses one expensive shared run (the pipeline, the Slurm cluster) must run on one worker, or each
worker makes its own (three Slurm clusters fight over /etc/slurm/slurm.conf; three pipeline runs
on two cores). pytest 9.2 renamed the node id attribute that pytest-xdist 3.8 rewrites, which
silently turned every group into single tests: this fails if grouping stops working again."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import ONE_WORKER_FILES, SHARED_RUN_FIXTURES, pytest_collection_modifyitems
from helpers import subprocess_env


def test_xdist_groups_keep_a_group_on_one_worker(tmp_path):
    tests = "\n".join(
        f"@pytest.mark.xdist_group('shared')\ndef test_grouped_{i}():\n    pass\n" for i in range(6)
    )
    (tmp_path / "test_grouped.py").write_text(f"import pytest\n\n{tests}")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "test_grouped.py"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = re.findall(
        r"\[(gw\d+)\].*PASSED test_grouped.py::(test_grouped_\d+)(@\w+)?", result.stdout
    )
    assert len(ran) == 6, result.stdout[-3000:]
    assert {suffix for _, _, suffix in ran} == {"@shared"}, "xdist did not see the group"
    assert len({worker for worker, _, _ in ran}) == 1, ran


def test_the_expensive_fixtures_and_files_get_their_group():
    class Item:
        def __init__(self, name, fixturenames):
            self.path = type("P", (), {"name": name})()
            self.fixturenames = fixturenames
            self.marks = []

        def add_marker(self, mark):
            self.marks.append(mark.args[0])

    items = [
        Item("test_pipeline.py", ["tmp_path", "full_run", "full_run_attempts"]),
        Item("test_report.py", ["slurm_cluster", "slurm_reference_run"]),
        Item("test_compile.py", ["demo_dir"]),
        Item("test_train.py", ["demo_dir", "tmp_path"]),
        Item("test_validation.py", ["validated_run", "trained_run", "demo_dir"]),
        Item("test_faults.py", ["demo_dir", "trained_run"]),
    ]
    pytest_collection_modifyitems(None, items)
    assert [item.marks for item in items] == [
        ["full_run_attempts"],
        ["slurm_cluster"],
        [ONE_WORKER_FILES["test_compile.py"]],
        [],
        ["trained_run"],  # one copy of trained_run for it and for validated_run's tests
        ["trained_run"],
    ]
    assert "slurm_cluster" in SHARED_RUN_FIXTURES
