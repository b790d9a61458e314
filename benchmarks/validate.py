"""Benchmark: `mini-trainer validate` against `datasets.load_dataset("json")` on the same file.

Generates a synthetic pre-tokenized JSONL file (long-tailed lengths, mean about 500 tokens) at
two sizes, warms the page cache, then runs each side in its own child process and reports its
wall time, samples/s and peak RSS (the child's own maximum resident set, read by a dedicated
measuring process with getrusage(RUSAGE_CHILDREN), so one measurement never sees another's
peak). Prints the ratios. The data lives under --workdir (default /tmp), never in the repo.

    python benchmarks/validate.py                      # 200,000 and 400,000 samples
    python benchmarks/validate.py --sizes 20000 40000  # a quick run
    python benchmarks/validate.py --workers 1          # validate on one core
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 32_000
MEAN_TOKENS = 500
SIGMA = 1.0

DATASETS_SCRIPT = """
import sys, tempfile, datasets
with tempfile.TemporaryDirectory(dir=sys.argv[2]) as cache:
    ds = datasets.load_dataset("json", data_files=sys.argv[1], cache_dir=cache, split="train")
    print(len(ds))
"""


def generate(path: Path, samples: int, seed: int = 0) -> None:
    """Write `samples` lines: log-normal lengths (mean ~500, clipped to 8..8192), 30% prompt."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mu = np.log(MEAN_TOKENS) - SIGMA**2 / 2
    lengths = np.clip(np.exp(rng.normal(mu, SIGMA, samples)), 8, 8192).astype(int)
    tmp = path.with_suffix(".partial")
    with open(tmp, "w") as out:
        for length in lengths:
            ids = rng.integers(0, VOCAB_SIZE, length).tolist()
            prompt = int(length * 0.3)
            labels = ",".join(["-100"] * prompt + [str(t) for t in ids[prompt:]])
            ids_text = ",".join(map(str, ids))
            out.write(f'{{"input_ids":[{ids_text}],"labels":[{labels}],"len":{length}}}\n')
    tmp.rename(path)


PROBE = """
import json, resource, subprocess, sys, tempfile, time
import psutil
out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
start = time.perf_counter()
child = subprocess.Popen(sys.argv[1:], stdout=out, stderr=err, text=True)
peak_tree = 0
parent = psutil.Process(child.pid)
while child.poll() is None:
    try:
        processes = [parent, *parent.children(recursive=True)]
        peak_tree = max(peak_tree, sum(p.memory_info().rss for p in processes))
    except psutil.Error:
        pass
    time.sleep(0.02)
wall = time.perf_counter() - start
peak_one = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
out.seek(0)
err.seek(0)
report = {"wall_s": wall, "peak_tree_mb": peak_tree / 2**20, "peak_one_mb": peak_one / 2**20}
report.update(rc=child.returncode, stdout=out.read()[-2000:], stderr=err.read()[-2000:])
print(json.dumps(report))
"""


def measure(command: list[str], env: dict[str, str]) -> dict:
    """Run `command` under a fresh measuring process; return its wall time and peak RSS.

    `peak_tree_mb`: the largest sum of RSS over the command and all its worker processes
    (polled every 20 ms); `peak_one_mb`: the largest single process (getrusage, exact).
    """
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *command], capture_output=True, text=True, env=env, check=True
    )
    report = json.loads(result.stdout)
    if report["rc"] != 0:
        raise SystemExit(f"{command[:4]} failed:\n{report['stderr']}")
    return report


def warm(path: Path) -> None:
    with open(path, "rb") as handle:
        while handle.read(1 << 24):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 400_000])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=None, help="validate --workers")
    args = parser.parse_args()

    work = args.workdir / "mini-trainer-bench-validate"
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": VOCAB_SIZE}))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")  # fmt: skip

    rows = []
    for samples in args.sizes:
        data = work / f"synthetic-{samples}.jsonl"
        if not data.exists():
            print(f"generating {data} ...", file=sys.stderr)
            generate(data, samples)
        warm(data)
        out = work / f"out-{samples}"
        out.mkdir(exist_ok=True)
        validate = measure(
            [sys.executable, "-m", "mini_trainer", "validate", str(data), "--model", str(model),
             "--max-tokens-per-gpu", str(args.max_tokens), "--out-index",
             str(out / "index.parquet"), "--out-summary", str(out / "summary.json"), "--force",
             *(["--workers", str(args.workers)] if args.workers else [])],
            env,
        )  # fmt: skip
        summary = json.loads((out / "summary.json").read_text())
        assert summary["samples"] == samples, summary
        warm(data)
        loaded = measure([sys.executable, "-c", DATASETS_SCRIPT, str(data), str(work)], env)
        assert int(loaded["stdout"].split()[-1]) == samples
        rows.append((samples, data.stat().st_size, summary, validate, loaded))

    print(f"machine: {os.cpu_count()} CPU cores; python {sys.version.split()[0]}; "
          f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}")  # fmt: skip
    header = (
        f"{'samples':>8} {'file MB':>8} {'mean len':>8} | {'validate s':>10} {'samples/s':>10} "
        f"{'peak MB':>8} {'(1 proc)':>8} | {'datasets s':>10} {'samples/s':>10} {'peak MB':>8} | "
        f"{'speed x':>7} {'RSS x':>6}"
    )
    print(header)
    for samples, size, summary, validate, loaded in rows:
        v_rate, d_rate = samples / validate["wall_s"], samples / loaded["wall_s"]
        print(
            f"{samples:>8} {size / 1e6:>8.0f} {summary['length']['mean']:>8.0f} | "
            f"{validate['wall_s']:>10.1f} {v_rate:>10.0f} {validate['peak_tree_mb']:>8.0f} "
            f"{validate['peak_one_mb']:>8.0f} | "
            f"{loaded['wall_s']:>10.1f} {d_rate:>10.0f} {loaded['peak_tree_mb']:>8.0f} | "
            f"{v_rate / d_rate:>7.2f} {loaded['peak_tree_mb'] / validate['peak_tree_mb']:>6.2f}"
        )
    print(
        "peak MB: largest sum of RSS over the process and its workers; (1 proc): largest single "
        "process.\nspeed x: validate samples/s over datasets samples/s; "
        "RSS x: datasets peak over validate peak"
    )


if __name__ == "__main__":
    main()
