"""What makes a run the run it is: options, data and base model, compared on `--resume`.

A state saved by run A and resumed with other settings would continue a different run while
the old optimizer state and schedule won: the record and the weights would disagree. So every
state stores a fingerprint, and `--resume` refuses one that differs from the current run's,
one line per differing option.

What the fingerprint covers:
- every `TrainingArgs` option except `MAY_CHANGE_ON_RESUME` (where and how often to save, what
  to log, kernels and memory settings that do not change the result, and paths whose content is
  fingerprinted instead);
- the data file: its size and content hash (see `sampled_file_digest`) plus a hash of its index
  (byte offsets, lengths, loss tokens of every sample);
- the base model: `config.json` whole, every weights file by `sampled_file_digest`, and for a Hub
  id the repository and commit it resolved to (a `main` that moved is refused by name);
- the validation file, if any: by `sampled_file_digest` too (its path is kept for the messages
  only), so a moved identical file resumes and an edited one is refused, naming it.

`sampled_file_digest` hashes files up to `FULL_HASH_BYTES` whole; larger files by their size,
their first and last MiB and `SAMPLED_BLOCKS` blocks spread evenly over the file. An edit of a large
file that keeps its size and touches none of the sampled bytes is not detected (for data, the
index hash still catches any change of a sample's length, loss tokens or line).
Modification times are not compared: a copy or an identical regeneration is the same input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import numpy as np

from mini_trainer.io_utils import hash_file
from mini_trainer.methods import REGISTERED
from mini_trainer.models.hub import hub_source, moved_branch_line
from mini_trainer.optimizer_options import layout_differences, state_layout

FULL_HASH_BYTES = 64 * 1024**2
"""Files up to this size are hashed whole (about 0.1 s per 64 MiB)."""
EDGE_BYTES = 1024**2
SAMPLED_BLOCKS = 256
BLOCK_BYTES = 64 * 1024

MAY_CHANGE_ON_RESUME = (
    "model_name_or_path",  # a path: the model's content is fingerprinted instead
    "model_revision",  # the resolved Hub commit is in the model fingerprint
    "data_path",  # a path: the data's content is fingerprinted instead
    "data_index",  # the index is derived from the data (its content is in the data fingerprint)
    "validation_data_path",  # a path: the validation file's content is fingerprinted instead
    "output_dir",  # the folder may be moved
    "resume",
    "save_every_steps",
    "keep_states",
    "drop_states_after_final",
    "async_save",  # when a state is written, not what it holds
    "checkpoint_at_epoch",
    "min_samples_per_checkpoint",
    "save_final_checkpoint",
    "save_dtype",
    "wandb_project",
    "wandb_run_name",
    "wandb_entity",
    "max_tokens_per_gpu",  # how a step is split, not what it computes (tested exact)
    "context_parallel",  # how a row is split over ranks, not what it computes (tested exact)
    "validation_max_tokens_per_gpu",  # how validation is split, not what it measures
    "activation_checkpointing",
    "cpu_offload",
    "use_liger_kernels",
    "compile",  # the same computation, compiled (tested equal to eager)
    "deterministic",  # which kernels compute it (the same bytes on the CPU)
)
"""Options that may differ between a state and the run that resumes it (docs/training.md)."""


def sampled_file_digest(path: str | os.PathLike) -> str:
    """A blake2b digest of `path`: whole up to FULL_HASH_BYTES, sampled beyond (see module)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.blake2b(digest_size=16)
    digest.update(str(size).encode())
    if size <= FULL_HASH_BYTES:
        return hash_file(digest, path).hexdigest()
    offsets = np.linspace(EDGE_BYTES, size - EDGE_BYTES - BLOCK_BYTES, SAMPLED_BLOCKS)
    ranges = [(0, EDGE_BYTES), (size - EDGE_BYTES, EDGE_BYTES)]
    ranges += [(int(offset), BLOCK_BYTES) for offset in offsets]
    return hash_file(digest, path, ranges).hexdigest()


def options_fingerprint(args) -> dict:
    """The run-defining options, as JSON values: every shared field but `MAY_CHANGE_ON_RESUME`,
    OSFT's options (in every run's, as before methods had names), and what the selected method's
    option group names (`MethodOptions.fingerprint_terms`; nothing for SFT and OSFT, so the
    states saved before `--method` resume)."""
    group = args.method_group()
    left_out = {"method", *MAY_CHANGE_ON_RESUME, *group.may_change_on_resume()}
    for other in REGISTERED:
        if not other.legacy_fingerprint:
            left_out |= {f.name for f in other.own_fields()}
    options = {n: v for n, v in dataclasses.asdict(args).items() if n not in left_out}
    return {**options, **group.fingerprint_terms(args)}


def data_fingerprint(data_path: str | os.PathLike, dataset) -> dict:
    """The data file's content digest and a digest of its index (lines, lengths, losses)."""
    index = hashlib.blake2b(digest_size=16)
    for column in (dataset.line_numbers, dataset.lengths, dataset.loss_tokens):
        index.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
    return {
        "samples": len(dataset),
        "file": sampled_file_digest(data_path),
        "index": index.hexdigest(),
    }


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def model_fingerprint(model_path: str | os.PathLike) -> dict:
    """`config.json` and every weights file of the model folder, by name and digest."""
    folder = Path(model_path)
    files = {"config.json": sampled_file_digest(folder / "config.json")}
    if source := hub_source(folder):
        files["hub"] = source
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name.endswith(WEIGHT_SUFFIXES):
            files[path.name] = sampled_file_digest(path)
    return files


def validation_fingerprint(path: str | os.PathLike | None) -> dict | None:
    """The validation file's content digest (and its path, for messages); None without one."""
    if path is None:
        return None
    return {"file": sampled_file_digest(path), "path": str(path)}


def run_fingerprint(args, dataset, world_size: int | None = None) -> dict:
    """Everything `--resume` compares: options, data, base model, validation file, and the
    optimizer state's layout where it depends on the world size (optimizer_options)."""
    return {
        "options": options_fingerprint(args),
        "data": data_fingerprint(args.data_path, dataset),
        "model": model_fingerprint(args.model_name_or_path),
        "validation": validation_fingerprint(args.validation_data_path),
        "layout": state_layout(args, world_size) if world_size else {},
    }


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def differences(saved: dict, current: dict) -> list[str]:
    """One line per difference between a state's fingerprint and this run's (empty: same run)."""
    lines = []
    saved_options, options = saved.get("options", {}), current["options"]
    for name in sorted(set(saved_options) | set(options)):
        if name in MAY_CHANGE_ON_RESUME:
            continue
        before, now = saved_options.get(name), options.get(name)
        if before != now:
            lines.append(
                f"{_flag(name)}: the state was saved with {before!r}, this run has {now!r}"
            )
    lines += layout_differences(saved.get("layout"), current.get("layout", {}))
    if saved.get("data") != current["data"]:
        old, new = saved.get("data") or {}, current["data"]
        detail = (
            f"{old.get('samples')} samples then, {new['samples']} now"
            if old.get("samples") != new["samples"]
            else "same number of samples, different content"
        )
        lines.append(f"--data-path: not the data the state was trained on ({detail})")
    lines += _validation_lines(saved, current.get("validation"))
    old_hub, new_hub = (saved.get("model") or {}).get("hub"), current["model"].get("hub")
    if old_hub and new_hub and old_hub != new_hub:
        lines.append(moved_branch_line(old_hub["hub_id"], old_hub["commit"], new_hub["commit"]))
    elif _files(saved.get("model")) != _files(current["model"]):
        old, new = _files(saved.get("model")), _files(current["model"])
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        lines.append(
            "--model-name-or-path: not the base model the state started from "
            f"(differs in {', '.join(changed)})"
        )
    return lines


def _validation_lines(saved: dict, now: dict | None) -> list[str]:
    """The validation file: there then and now, with the same content (paths may differ)."""
    if "validation" in saved:
        then = saved["validation"]
    else:  # saved before validation files were fingerprinted by content: only its path is known
        path = saved.get("options", {}).get("validation_data_path")
        then = None if path is None else {"path": path}
    flag = "--validation-data-path"
    if then is None and now is None:
        return []
    if then is None:
        return [f"{flag}: the state was saved without a validation file, this run has "
                f"{now['path']}"]  # fmt: skip
    if now is None:
        return [f"{flag}: the state was saved with the validation file {then['path']}, this "
                "run has none"]  # fmt: skip
    if "file" in then and then["file"] != now["file"]:
        moved = "" if then["path"] == now["path"] else f" (then {then['path']})"
        return [f"{flag}: {now['path']}: not the validation data the state was saved with "
                f"(different content{moved})"]  # fmt: skip
    return []


def _files(model: dict | None) -> dict:
    """A model fingerprint's file digests (a Hub copy and a local copy of it compare equal)."""
    return {name: value for name, value in (model or {}).items() if name != "hub"}
