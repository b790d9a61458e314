"""The peak disk of a whole pipeline experiment (`mini-trainer plan --config`): one run's disk
figures (a training state, a Hugging Face checkpoint, the SVD cache; `host.host_and_disk`)
times what the experiment holds at its fullest.

The fullest moment is counted as the end of the last stage with every earlier output kept: every
run's final/ (and best/) and `hf_format/samples_<N>/` exports (`checkpoint_at_epoch`,
`min_samples_per_checkpoint`: each one Hugging Face checkpoint, as many as the run's steps over
its training file give), every SVD cache, the evaluations, the data files under results/data
(`pipeline/data_sizes.py`: measured, or estimated from the files they copy), the logs and
metrics, and the training states of the jobs that can run at once (one per method and learning
rate: each holds `keep_states` states and writes one more before the oldest is pruned). With
`keep_states_after_final`, every finished run's states stay too. Not counted: old run keys'
folders, the lengths indexes (a few bytes a sample), Snakemake's own files, and what a line's
note names as not known (a tokenized chat file not yet written, the exports of a run whose
training file is not).
"""

from __future__ import annotations

from dataclasses import dataclass

EVALUATION_BYTES = 4096
"""One evaluation JSON, rounded up (the demo's are under 1 KB; lm-eval tasks add a few)."""
LOG_BYTES = 64 * 1024
"""One job's log and benchmark files, rounded up (a training job logs a few lines per save)."""
METRICS_ROW_BYTES = 1024
"""One metrics.jsonl row (one per optimizer step), rounded up (the demo's are about 430 bytes;
a mixture of experts' and a method's own fields add more)."""


@dataclass(frozen=True)
class DataDisk:
    """The experiment's data files and logs (`pipeline/experiment.py` counts them)."""

    data_bytes: int
    """The files under results/data that were measured or estimated, together."""
    data_files: int
    """How many files results/data will hold."""
    unknown: tuple[str, ...]
    """Data files whose size is not known (not counted)."""
    jobs: int
    """Jobs that write a log."""


@dataclass(frozen=True)
class MethodDisk:
    """One method's counts and its one-run figures, in bytes."""

    name: str
    runs: int
    chains: int
    svd_caches: int
    keep_states: int
    state_bytes: int
    checkpoint_bytes: int
    svd_bytes: int
    steps: int | None = 0
    """Optimizer steps of its runs together (None: not known)."""
    exports: int | None = 0
    """`hf_format/samples_<N>/` exports of its runs together (None: not known)."""


def experiment_lines(
    methods: list[MethodDisk], keep_after_final: bool, best: bool, evaluations: int,
    data: DataDisk | None = None,
) -> list[dict]:  # fmt: skip
    """The experiment's disk lines, each {name, bytes, note}; the last one is the peak."""
    lines = []
    for m in methods:
        exports = m.runs * (2 if best else 1)
        lines.append({
            "name": f"{m.name}: final/{' and best/' if best else ''} of {m.runs} run(s)",
            "bytes": exports * m.checkpoint_bytes,
            "note": f"{exports} x {m.checkpoint_bytes:,} bytes",
        })  # fmt: skip
        if m.exports is None or m.exports:
            lines.append({
                "name": f"{m.name}: hf_format/ exports",
                "bytes": (m.exports or 0) * m.checkpoint_bytes,
                "note": f"{m.exports} x {m.checkpoint_bytes:,} bytes" if m.exports else
                "not known: a run's training file is not written yet; each export is one "
                "Hugging Face checkpoint",
            })  # fmt: skip
        if keep_after_final:
            held = m.runs * m.keep_states + m.chains
            note = f"every run keeps {m.keep_states}; +1 per running job while it saves"
        else:
            held = m.chains * (m.keep_states + 1)
            note = (f"{m.chains} job(s) at once, each {m.keep_states} kept + 1 being written; "
                    "dropped once final/ is written")  # fmt: skip
        lines.append({
            "name": f"{m.name}: training states",
            "bytes": held * m.state_bytes,
            "note": f"{held} x {m.state_bytes:,} bytes: {note}",
        })  # fmt: skip
        if m.svd_caches:
            lines.append({
                "name": f"{m.name}: SVD caches",
                "bytes": m.svd_caches * m.svd_bytes,
                "note": f"{m.svd_caches} x {m.svd_bytes:,} bytes",
            })  # fmt: skip
    lines.append({
        "name": "evaluations",
        "bytes": evaluations * EVALUATION_BYTES,
        "note": f"{evaluations} JSON files, at most {EVALUATION_BYTES:,} bytes each",
    })  # fmt: skip
    if data is not None:
        lines += data_lines(data, [m.steps for m in methods])
    lines.append({
        "name": "peak disk of the experiment",
        "bytes": sum(line["bytes"] for line in lines),
        "note": "all outputs at the end, plus the states of the jobs running then; not "
        "counted: lengths indexes, old run keys, what a line calls not known",
    })  # fmt: skip
    return lines


def data_lines(data: DataDisk, steps: list[int | None]) -> list[dict]:
    """The lines of results/data, and of logs/ with every run's metrics.jsonl."""
    unknown = f"; not known (not counted): {', '.join(data.unknown)}" if data.unknown else ""
    rows = sum(s for s in steps if s is not None)
    missing = "" if all(s is not None for s in steps) else "; a method's steps not known"
    return [
        {
            "name": "data (results/data)",
            "bytes": data.data_bytes,
            "note": f"{data.data_files} file(s), measured or estimated from what they copy"
            + unknown,
        },
        {
            "name": "logs and metrics",
            "bytes": data.jobs * LOG_BYTES + rows * METRICS_ROW_BYTES,
            "note": f"{data.jobs} job logs x {LOG_BYTES:,} bytes + {rows} metrics rows x "
            f"{METRICS_ROW_BYTES:,} bytes{missing}",
        },
    ]


def render(lines: list[dict], header: str) -> str:
    """The lines as a table for people."""
    out = [header]
    for line in lines:
        out.append(f"  {line['name']:44s} {_size(line['bytes']):>12s}  ({line['note']})")
    return "\n".join(out)


def _size(value: int) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)):
        if value >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value / 1024:,.1f} KiB"
