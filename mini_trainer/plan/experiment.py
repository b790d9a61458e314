"""The peak disk of a whole pipeline experiment (`mini-trainer plan --config`): one run's disk
figures (a training state, a Hugging Face checkpoint, the SVD cache; `host.host_and_disk`)
times what the experiment holds at its fullest.

The fullest moment is counted as the end of the last stage with every earlier output kept: every
run's final/ (and best/), every SVD cache, the evaluations, and the training states of the jobs
that can run at once (one per method and learning rate: each holds `keep_states` states and
writes one more before the oldest is pruned). With `keep_states_after_final`, every finished
run's states stay too. Not counted: the data files, logs, old run keys' folders, and the
`hf_format/samples_<N>/` exports of `checkpoint_at_epoch` or `min_samples_per_checkpoint` (how
many depends on the data's size; each is one Hugging Face checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

EVALUATION_BYTES = 4096
"""One evaluation JSON, rounded up (the demo's are under 1 KB; lm-eval tasks add a few)."""


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


def experiment_lines(
    methods: list[MethodDisk], keep_after_final: bool, best: bool, evaluations: int
) -> list[dict]:
    """The experiment's disk lines, each {name, bytes, note}; the last one is the peak."""
    lines = []
    for m in methods:
        exports = m.runs * (2 if best else 1)
        lines.append({
            "name": f"{m.name}: final/{' and best/' if best else ''} of {m.runs} run(s)",
            "bytes": exports * m.checkpoint_bytes,
            "note": f"{exports} x {m.checkpoint_bytes:,} bytes",
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
    lines.append({
        "name": "peak disk of the experiment",
        "bytes": sum(line["bytes"] for line in lines),
        "note": "all outputs at the end, plus the states of the jobs running then; not "
        "counted: data, logs, hf_format/ exports",
    })  # fmt: skip
    return lines


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
