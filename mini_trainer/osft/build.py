"""`mini-trainer osft-svd`: compute the SVD of every target once and write the cache folder.

Under torchrun the targets are dealt out over the ranks (target i goes to rank i mod N); each
rank writes its own factor files into one shared temporary folder, rank 0 writes meta.json and
renames the folder into place, so DIR appears complete or not at all. SVDs run on the GPU when
there is one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from mini_trainer.data.outputs import check_writable
from mini_trainer.distributed.env import env_world
from mini_trainer.distributed.runtime import broadcast_object, init_runtime
from mini_trainer.errors import UserError
from mini_trainer.io_utils import publish_dir, temp_sibling
from mini_trainer.osft import cache, svd
from mini_trainer.osft.experts import expert_weights
from mini_trainer.osft.targets import candidate_linears, layer_index, select_targets
from mini_trainer.versions import package_versions

log = logging.getLogger("mini_trainer")
PART_BYTES = 1024**3
"""A rank starts a new factor file after this many bytes, so no rank holds all its factors."""


def model_targets(model_dir: Path, patterns: list[str] | None) -> dict[str, tuple[int, int]]:
    """Target module name -> weight shape (rows, cols; experts, rows, cols for a fused experts
    weight), read from the config alone."""
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as error:
        raise UserError(f"{model_dir}: not a readable model folder ({error})") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linears = candidate_linears(model)
    experts = expert_weights(model)
    chosen = select_targets([*linears, *experts], patterns)
    chosen.sort(key=layer_index)  # the order training adapts them in (osft/method.py)
    return {
        name: experts[name] if name in experts else
        (linears[name].out_features, linears[name].in_features)
        for name in chosen
    }  # fmt: skip


def build_cache(model_dir: Path, out: Path, patterns: list[str] | None, force: bool) -> dict:
    """Write the cache folder `out` for `model_dir`; return its meta (rank 0; None elsewhere)."""
    if out.exists() and not force:
        raise UserError(f"{out}: already exists (pass --force to replace it)")
    check_writable(out.parent, "--out")
    targets = model_targets(model_dir, patterns)
    cache.check_target_weights(model_dir, targets)  # headers only, before any work
    distributed = env_world()[2] > 1
    runtime = init_runtime() if distributed else None
    rank, world = (runtime.rank, runtime.world_size) if runtime else (0, 1)
    tmp = None
    try:
        if rank == 0:
            tmp = temp_sibling(out, is_dir=True)
        tmp = broadcast_object(tmp, runtime) if runtime else tmp
        started = time.perf_counter()
        names = list(targets)[rank::world]
        mine = _factorize(model_dir, {name: targets[name] for name in names}, tmp, rank)
        gathered = [mine]
        if runtime:
            gathered = [None] * world
            dist.all_gather_object(gathered, mine)
        meta = None
        if rank == 0:
            meta = _meta(model_dir, patterns, targets, gathered)
            (tmp / cache.META).write_text(json.dumps(meta, indent=2) + "\n")
            publish_dir(tmp, out)
            # The command reports the folder it wrote; this is only how long the SVDs took.
            log.info("osft-svd: the SVDs took %.1f s on %d rank(s)",
                     time.perf_counter() - started, world)  # fmt: skip
        return meta
    except BaseException:
        if rank == 0 and tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if runtime:
            dist.barrier()
            dist.destroy_process_group()


def _factorize(model_dir: Path, names: dict[str, tuple], folder: Path, rank: int) -> dict:
    """SVD of this rank's targets into its own files; (files, target -> file, digests)."""
    files, where, digests = {}, {}, {}
    part: dict[str, torch.Tensor] = {}

    def flush() -> None:
        if not part:
            return
        name = f"factors-{rank:05d}-{len(files):05d}.safetensors"
        save_file(part, folder / name)
        os.chmod(folder / name, 0o644)
        files[name] = {
            "bytes": (folder / name).stat().st_size,
            "sha256": cache.file_sha256(folder / name),
        }
        part.clear()

    device = svd.svd_device()
    for module, shape in names.items():
        weight_name = cache.weight_key(module, shape)
        weight = cache.read_weights(model_dir, [weight_name])[weight_name]
        digests[weight_name] = cache.tensor_digest(weight_name, weight)
        u, s, v = svd.thin_svd(weight, device)
        part.update({f"{module}.U": u, f"{module}.S": s, f"{module}.V": v})
        where[module] = f"factors-{rank:05d}-{len(files):05d}.safetensors"
        if sum(t.numel() * t.element_size() for t in part.values()) >= PART_BYTES:
            flush()
    flush()
    return {"files": files, "where": where, "digests": digests}


def _meta(model_dir: Path, patterns, targets: dict, gathered: list[dict]) -> dict:
    files, where, digests = {}, {}, {}
    for part in gathered:
        files.update(part["files"])
        where.update(part["where"])
        digests.update(part["digests"])
    return {
        "format": cache.FORMAT,
        "model": str(model_dir),
        "source_hash": cache.combined_hash(digests),
        "hash": "sha256 over the targeted weights' names, dtypes, shapes and bytes",
        "patterns": patterns,
        "dtype": "float32",
        "targets": {
            name: {"shape": list(shape), "rank": min(shape[-2:]), "file": where[name]}
            for name, shape in targets.items()
        },
        "files": dict(sorted(files.items())),
        "versions": package_versions(cache.CACHE_PACKAGES),
        "created": time.time(),
    }
