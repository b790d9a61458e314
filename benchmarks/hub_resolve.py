"""What resolving a cached Hub id adds to a command's start, against naming the local folder.

A start resolves its model once (`mini_trainer.models.hub.resolve_once_per_node`). With a local
folder that is a directory test; with a Hub id it imports huggingface_hub, finds the snapshot
that `refs/main` names in the cache (offline: `HF_HUB_OFFLINE=1`, as on compute nodes), checks
it against the cached tree listing and checks the safetensors index. Each sample is a fresh
interpreter that times the resolve call; the sides alternate, and the medians are compared.
Two cases: after `import transformers` (train, evaluate, osft-svd and tokenize import it at
every start anyway, and it imports huggingface_hub), and cold (the import of huggingface_hub
counted too: `validate` and `resolve-model` pay it).

    python benchmarks/hub_resolve.py [--runs 15]   # builds the demo model and a cache from it
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

PROBE = """
import sys, time
if sys.argv[2] == "warm":
    import transformers
started, cpu = time.perf_counter(), time.process_time()
from mini_trainer.models.hub import resolve_once_per_node
resolved = resolve_once_per_node(sys.argv[1])
print(time.perf_counter() - started, time.process_time() - cpu, resolved.folder)
"""


def sample(name: str, env: dict, case: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one resolve in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE, name, case], env=env, text=True, check=True,
                         capture_output=True).stdout.split()  # fmt: skip
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    from hf_cache import build_hub_cache

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "mini_trainer", "demo-assets", "--out", tmp],
                       check=True, capture_output=True)  # fmt: skip
        repo = build_hub_cache(Path(tmp) / "model", Path(tmp) / "hf_home")
        env = {**os.environ, "PYTHONPATH": str(REPO), **repo.env()}
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        sides = (
            ("local folder", str(Path(tmp) / "model")),
            (f"Hub id {repo.repo_id}", repo.repo_id),
        )
        for _ in range(runs):
            for case in ("warm", "cold"):
                for label, name in sides:
                    times.setdefault((case, label), []).append(sample(name, env, case))
    print(f"load average {os.getloadavg()[0]:.2f}; {runs} fresh interpreters per side and case")
    for case in ("warm", "cold"):
        walls, cpus = [], []
        for label, _ in sides:
            values = times[(case, label)]
            walls.append(statistics.median(v[0] for v in values))
            cpus.append(statistics.median(v[1] for v in values))
            print(f"{case:>4} {label:>28}: median {walls[-1] * 1000:7.1f} ms wall, "
                  f"{cpus[-1] * 1000:7.1f} ms CPU")  # fmt: skip
        added = "added by the Hub id"
        print(f"{case:>4} {added:>28}: {(walls[1] - walls[0]) * 1000:7.1f} ms wall, "
              f"{(cpus[1] - cpus[0]) * 1000:7.1f} ms CPU")  # fmt: skip


if __name__ == "__main__":
    main()
