"""Checkpoints: Hugging Face folders for use, full training states for exact resume.

Both are written under a temporary name and renamed when complete, so a crash never leaves a
half folder under the final name, and `--resume` only ever sees complete states.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from transformers import AutoTokenizer, GenerationConfig

from mini_trainer.distributed.runtime import Runtime, broadcast_object
from mini_trainer.io_utils import atomic_path, publish_dir, temp_sibling
from mini_trainer.models.export import export_hf_weights
from mini_trainer.training.async_save import BackgroundWriter
from mini_trainer.training.run_folder import state_dirs
from mini_trainer.training.state_checksums import write_checksums
from mini_trainer.training.trainer_state import TRAINER_STATE, TrainerState

log = logging.getLogger("mini_trainer")

TRAINING_ARGS = "training_args.json"
MAX_SHARD_BYTES = 5 * 1024**3


def _shared_temp_dir(final: Path, runtime: Runtime) -> Path:
    """A temporary sibling of `final` created by rank 0, its name known to every rank."""
    name = temp_sibling(final, is_dir=True).name if runtime.is_main else None
    return final.parent / broadcast_object(name, runtime)


# ---------------------------------------------------------------------------- HF export


def save_hf_checkpoint(
    model,
    config,
    model_path: str,
    final: Path,
    save_dtype: str,
    runtime: Runtime,
    to_dense=lambda state: state,
    training_args: dict | None = None,
    extra_json: dict[str, dict] | None = None,
) -> None:
    """Write a loadable Hugging Face folder, gathering and writing one module at a time.

    `to_dense` maps the training model's state to dense Hugging Face weights (the method's
    `export_weights`; identity for full fine-tuning); it is called per module. Rank 0 never
    holds the whole model (`models/export.py`). `training_args` (the run's resolved arguments)
    is written into the folder as `training_args.json`, so a model used elsewhere, or as the
    start of a chained stage, still says which run, data and base weights it came from.
    `extra_json` ({file name: dict}) adds metadata files, published with the weights.
    """
    dtype = getattr(torch, save_dtype)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    if runtime.is_main:
        with atomic_path(final, is_dir=True) as tmp:
            export_hf_weights(model, tmp, dtype, runtime, to_dense, tied, MAX_SHARD_BYTES)
            _write_hf_extras(config, model_path, tmp, dtype)
            if training_args is not None:
                (tmp / TRAINING_ARGS).write_text(json.dumps(training_args, indent=2) + "\n")
            for name, content in (extra_json or {}).items():
                (tmp / name).write_text(json.dumps(content, indent=2) + "\n")
        log.info("saved %s", final)
    else:
        export_hf_weights(model, None, dtype, runtime, to_dense, tied, MAX_SHARD_BYTES)
    dist.barrier()


def _write_hf_extras(config, model_path: str, out: Path, dtype) -> None:
    """Everything of the folder but the weights: config, generation config, tokenizer."""
    export_config = type(config).from_dict(config.to_dict())
    export_config.use_cache = True  # trained without a cache; inference wants one
    export_config.dtype = dtype
    if hasattr(export_config, "quantization_config"):  # e.g. gpt-oss's MXFP4: written dense
        del export_config.quantization_config
    export_config.save_pretrained(out)
    with contextlib.suppress(OSError):  # the base model may have no generation config
        GenerationConfig.from_pretrained(model_path).save_pretrained(out)
    try:
        AutoTokenizer.from_pretrained(model_path).save_pretrained(out)
    except (OSError, ValueError):
        log.warning("%s: no tokenizer to copy into the checkpoint", model_path)


# ---------------------------------------------------------------------------- training state


def save_state(
    out_dir: Path,
    step: int,
    model,
    optimizer,
    trainer_state: TrainerState,
    runtime: Runtime,
    keep: int,
    writer: BackgroundWriter | None = None,
) -> Path:
    """Write `state/step_<step>/`: sharded model and optimizer, trainer state, RNG per rank,
    and last `checksums.json` (every other file's xxh3-64 digest); then publish it by a rename.

    With a `writer` (`--async-save`) the state is copied to host memory here and written by
    the writer's background thread (`async_save.py`); the caller waits for it (`writer.wait`)
    before the next save, at the end and on a stop. Every rank calls this at the same step."""
    final = out_dir / "state" / f"step_{step}"
    tmp = _shared_temp_dir(final, runtime)
    model_state, optim_state = get_state_dict(model, optimizer)
    content = {"model": model_state, "optim": optim_state}
    rng = _rng_state()
    trainer_json = trainer_state.to_json() if runtime.is_main else None
    if writer is None:
        write_state(tmp, final, content, rng, trainer_json, runtime, keep)
    else:
        staged = writer.stage(content)
        job = functools.partial(
            write_state, tmp, final, staged, rng, trainer_json, runtime, keep, writer.group
        )
        writer.submit(f"state/step_{step}", job)
    return final


def write_state(
    tmp: Path,
    final: Path,
    content: dict,
    rng: dict,
    trainer_json: str | None,
    runtime: Runtime,
    keep: int,
    group=None,
) -> None:
    """Write a state's files into `tmp`, agree that every rank wrote its part, hash them
    (`checksums.json`, last) and publish `tmp` as `final`; prune older states. Every rank,
    together; the collectives run on `group` (None: the default group)."""
    dcp.save(content, checkpoint_id=str(tmp), process_group=group)
    error = None
    try:
        _write_synced(tmp / f"rng_rank{runtime.rank}.pt", rng)
        if trainer_json is not None:
            _write_synced(tmp / TRAINER_STATE, trainer_json)
    # (torch.save reports a full disk as a RuntimeError: save_guard.py finds the cause)
    except (OSError, RuntimeError) as caught:  # every rank learns of it: none waits below
        error = caught
    _every_rank_wrote(error, runtime, group)
    write_checksums(tmp, runtime, group)
    if runtime.is_main:
        publish_dir(tmp, final)
        _prune_states(final.parent, keep)
        log.info("saved training state %s", final)
    dist.barrier(group=group)


def _every_rank_wrote(error: Exception | None, runtime: Runtime, group) -> None:
    """Raise `error` on its rank, and an OSError naming the failed rank on the others."""
    errors: list = [error]
    if dist.is_initialized() and runtime.world_size > 1:
        errors = [None] * runtime.world_size
        dist.all_gather_object(errors, None if error is None else str(error), group=group)
    if error is not None:
        raise error
    for rank, failed in enumerate(errors):
        if failed is not None:
            raise OSError(f"rank {rank} could not write its part of the state: {failed}")


def drop_states(out_dir: Path, runtime: Runtime) -> None:
    """Delete `state/` of a run whose final/ is published (`--drop-states-after-final`).

    Every rank first passes a barrier (final/ is complete on disk); rank 0 then renames
    `state/` to a temporary sibling and deletes that, so a crash midway leaves no half-deleted
    state under `state/` (`remove_stale_temp_dirs` removes the rest at the next start). A
    later `--resume` finds a FINISHED folder (run_folder.py)."""
    dist.barrier()
    root = out_dir / "state"
    if runtime.is_main and root.is_dir():
        size = sum(path.stat().st_size for path in root.rglob("*") if path.is_file())
        doomed = temp_sibling(root, is_dir=True)
        os.rmdir(doomed)
        os.replace(root, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("final/ written: dropped the run's training states (%s, %d bytes)", root, size)
    dist.barrier()


def remove_stale_temp_dirs(out_dir: Path) -> None:
    """Delete temporary folders that a crashed save left under `out_dir` (rank 0, at start)."""
    for pattern in (".*.tmp-*", "hf_format/.*.tmp-*", "state/.*.tmp-*"):
        for path in out_dir.glob(pattern):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)


def _prune_states(state_root: Path, keep: int) -> None:
    """Keep the newest `keep` published states. Called right after a save, so the newest one is
    the state just written whole; older damaged ones were moved aside when a resume met them."""
    for _, path in state_dirs(state_root.parent)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


def load_state(path: Path, model, optimizer, runtime: Runtime) -> TrainerState:
    """Load a state written by `save_state` into `model` and `optimizer`; return trainer state."""
    model_state, optim_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optim": optim_state}
    dcp.load(loaded, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"]
    )
    rng_file = path / f"rng_rank{runtime.rank}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        log.warning("%s: no RNG state for rank %d (world size changed?)", path, runtime.rank)
    return TrainerState.read(path)


def _write_synced(path: Path, content) -> None:
    """Write text or a torch object and fsync it, so a published state is on disk whole."""
    with open(path, "wb") as handle:
        if isinstance(content, str):
            handle.write(content.encode())
        else:
            torch.save(content, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
