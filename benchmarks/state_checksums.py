"""What the per-file checksums of a saved state cost: at save time and at resume time.

One process (a world of one, gloo), the demo model (or `--model DIR`) with AdamW state after one
step, saved with the real `checkpoint.save_state`. Both sides run in this process, interleaved,
`--repeats` times each; medians are printed:
- save: `save_state` as shipped (checksums written last) against the same call with
  `write_checksums` replaced by a no-op, and `write_checksums`'s own time inside the call (the
  difference of two ~80 ms medians is noisier than the few milliseconds it measures);
- resume: the damage check with contents verified (`run_folder.damage`, what a resume runs)
  against the same check without (sizes and small files only), next to `load_state` itself.
The goal (issue 25.5): the added time at most 5% of a state save.

    python benchmarks/state_checksums.py                     # builds the demo model in a temp dir
    python benchmarks/state_checksums.py --model DIR --repeats 9
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def timed(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of `fn()`."""
    started, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - started, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="Hugging Face model folder (default: the demo model)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.training import checkpoint, run_folder
    from mini_trainer.training.trainer_state import Progress, TrainerState

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="state-checksums-"))
    try:
        model_dir = args.model
        if model_dir is None:
            from mini_trainer.demo.assets import build_demo_assets

            build_demo_assets(work / "demo")
            model_dir = work / "demo" / "model"
        runtime = init_runtime()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.arange(16)[None], labels=torch.arange(16)[None]).loss.backward()
        optimizer.step()
        state = TrainerState(progress=Progress(step=1))
        real_write = checkpoint.write_checksums
        inside: list[tuple[float, float]] = []  # write_checksums' own time within save_state

        def timed_write(*write_args, **write_kwargs):
            inside.append(timed(lambda: real_write(*write_args, **write_kwargs)))

        sides = ("plain", "checksums", "check", "verify", "load")
        times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for repeat in range(args.repeats):
            for side in ("plain", "checksums") if repeat % 2 else ("checksums", "plain"):
                out = work / f"{side}-{repeat}"
                checkpoint.write_checksums = timed_write if side == "checksums" else _no_op
                save = (out, 1, model, optimizer, state, runtime, 1)
                times[side].append(timed(lambda: checkpoint.save_state(*save)))  # noqa: B023
            checkpoint.write_checksums = real_write
            saved = work / f"checksums-{repeat}" / "state" / "step_1"
            for side in ("check", "verify") if repeat % 2 else ("verify", "check"):
                verify = side == "verify"
                times[side].append(timed(lambda: run_folder.damage(saved, verify_contents=verify)))  # noqa: B023
            times["load"].append(
                timed(lambda: checkpoint.load_state(saved, model, optimizer, runtime))  # noqa: B023
            )
        size = sum(f.stat().st_size for f in saved.iterdir())
        wall = {name: statistics.median(w for w, _ in values) for name, values in times.items()}
        cpu = {name: statistics.median(c for _, c in values) for name, values in times.items()}
        print(f"model {model_dir}; state {size / 2**20:.1f} MiB ({len(list(saved.iterdir()))} "
              f"files); {args.repeats} interleaved repeats; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
        for name, label in (("plain", "save_state without checksums"),
                            ("checksums", "save_state with checksums"),
                            ("check", "damage check, sizes and small files"),
                            ("verify", "damage check with checksums verified"),
                            ("load", "load_state (reference)")):  # fmt: skip
            print(f"  {label:40s} median {wall[name] * 1000:8.1f} ms wall "
                  f"{cpu[name] * 1000:8.1f} ms CPU")  # fmt: skip
        own_wall = statistics.median(w for w, _ in inside)
        own_cpu = statistics.median(c for _, c in inside)
        print(f"write_checksums itself, inside save_state: {own_wall * 1000:.1f} ms wall = "
              f"{100 * own_wall / wall['plain']:.1f}% of a state save; {own_cpu * 1000:.1f} ms "
              f"CPU = {100 * own_cpu / wall['plain']:.1f}%")  # fmt: skip
        for what, (a, b) in (("save", ("plain", "checksums")), ("resume", ("check", "verify"))):
            added_wall, added_cpu = wall[b] - wall[a], cpu[b] - cpu[a]
            print(f"added at {what + ':':7s} {added_wall * 1000:7.1f} ms wall = "
                  f"{100 * added_wall / wall['plain']:5.1f}% of a state save; "
                  f"{added_cpu * 1000:7.1f} ms CPU = "
                  f"{100 * added_cpu / wall['plain']:5.1f}%")  # fmt: skip
        shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _no_op(*_args, **_kwargs) -> None:
    return None


if __name__ == "__main__":
    main()
