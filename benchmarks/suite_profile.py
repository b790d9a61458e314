"""Where the test suite's time goes: CPU seconds per test, its child processes included.

On the 2-core machine the suite is CPU-bound (three workers share two cores), so wall time per
test says more about its neighbours than about itself; CPU time does not. As a pytest plugin
this records, for every test (setup, call and teardown), the CPU time of the worker and of the
child processes it waited for (torchrun, the launcher, Snakemake and their jobs; Slurm jobs run
under slurmd and are not counted), the wall time and the worker:

    PYTHONPATH=benchmarks SUITE_PROFILE=/tmp/suite.jsonl \\
        .venv/bin/python -m pytest -n 3 --dist loadgroup -p suite_profile -p no:cacheprovider

Then `python benchmarks/suite_profile.py /tmp/suite.jsonl` prints the totals, the files and the
tests that cost the most, and when each worker finished.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import Counter, defaultdict

import pytest


def _cpu_seconds() -> tuple[float, float]:
    """(this process, its waited-for children), user plus system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own0, children0 = _cpu_seconds()
    start = time.time()
    yield
    own1, children1 = _cpu_seconds()
    end = time.time()
    row = {"id": item.nodeid, "self": round(own1 - own0, 2),
           "children": round(children1 - children0, 2), "wall": round(end - start, 2),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"), "end": round(end, 1)}  # fmt: skip
    with open(os.environ.get("SUITE_PROFILE", "suite_profile.jsonl"), "a") as out:
        out.write(json.dumps(row) + "\n")


def summarize(path: str, top: int = 25) -> None:
    with open(path) as lines:
        rows = [json.loads(line) for line in lines]
    cpu = {row["id"]: row["self"] + row["children"] for row in rows}
    print(f"{len(rows)} tests: {sum(cpu.values()):.0f} CPU-s, "
          f"{sum(row['wall'] for row in rows):.0f} test-seconds")  # fmt: skip
    by_file: Counter[str] = Counter()
    for row in rows:
        by_file[row["id"].split("::")[0]] += cpu[row["id"]]
    print("\nCPU-s by file:")
    for name, seconds in by_file.most_common(15):
        print(f"{seconds:8.1f}  {name}")
    print(f"\nthe {top} tests that cost the most (CPU-s, wall s):")
    for row in sorted(rows, key=lambda row: -cpu[row["id"]])[:top]:
        print(f"{cpu[row['id']]:8.1f} {row['wall']:7.1f}  {row['id'][:110]}")
    start = min(row["end"] - row["wall"] for row in rows)
    ends: defaultdict[str, float] = defaultdict(float)
    for row in rows:
        ends[row["worker"]] = max(ends[row["worker"]], row["end"] - start)
    print("\nworkers finished after (s):", {worker: round(s) for worker, s in sorted(ends.items())})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/suite_profile.py PROFILE.jsonl")
    summarize(sys.argv[1])
