"""The `ewc-fisher` folder: a diagonal Fisher and the weights it was taken at.

Estimator (stated, as TRACE and Avalanche compute it): the squared gradient of each mini-batch's
mean token loss, averaged over the mini-batches, `F = 1/B sum_b (grad L_b)^2`. It is not the
per-sample empirical Fisher (a sum of per-sample squared gradients): that needs one backward per
sample of the whole stage's data to be exact; the mini-batch estimate costs one backward per
mini-batch and its scale is absorbed by lambda. The loss is the training's: cross-entropy of the
sample's labels, summed over its loss tokens, divided by the mini-batch's loss tokens.

Online accumulation (online EWC, Schwarz et al. 2018): the folder of stage s holds
`F_s = gamma * F_(s-1) + F(stage s data at theta_s)` and the anchor `theta_s` (the weights it was
taken at, the next stage's start); gamma 1 sums the stages' Fishers, gamma < 1 forgets the older
ones. The anchor is stored, not re-read from the model, so a resumed run penalizes the distance
to the right weights.

Files: `fisher.safetensors` and `anchor.safetensors` (fp32, the Hugging Face parameter names),
`meta.json` (estimator, gamma, stages, sizes, the blake2b of each file and of the model weights,
and one checksum over them). The folder appears complete or not at all; training checks the
files against their checksums and the model against the one the anchor came from.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from mini_trainer.errors import UserError
from mini_trainer.io_utils import atomic_path, hash_file
from mini_trainer.methods.ewc import FISHER_META
from mini_trainer.models.safetensors_file import TensorEntry, read_header, read_tensor

log = logging.getLogger("mini_trainer")
FISHER_FILE = "fisher.safetensors"
ANCHOR_FILE = "anchor.safetensors"
ESTIMATOR = "squared gradients of mini-batch mean losses, averaged over mini-batches"
IGNORE_INDEX = -100


def model_weights_hash(model_dir: Path) -> str:
    """blake2b over the model folder's safetensors files, by name and content."""
    digest = hashlib.blake2b(digest_size=16)
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise UserError(f"{model_dir}: no *.safetensors weights")
    for path in files:
        digest.update(path.name.encode())
        hash_file(digest, path)
    return digest.hexdigest()


def _file_hash(path: Path) -> str:
    return hash_file(hashlib.blake2b(digest_size=16), path).hexdigest()


def _checksum(record: dict) -> str:
    """One hash over the meta fields that define the folder (files, model, gamma, stages)."""
    keys = ("files", "model_hash", "gamma", "stages", "estimator")
    text = json.dumps({k: record[k] for k in keys}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


# ---------------------------------------------------------------------------- computing


def sample_loss_sum(model: nn.Module, sample: dict) -> Tensor:
    """Summed cross-entropy of one sample's loss tokens (labels[t+1] after input_ids[:t+1])."""
    ids = torch.tensor(sample["input_ids"], dtype=torch.long)[None]
    labels = torch.tensor(sample["labels"][1:] + [IGNORE_INDEX], dtype=torch.long)
    logits = model(input_ids=ids, use_cache=False).logits[0].float()
    return nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _batches(samples: Iterable[dict], batch_size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def diagonal_fisher(
    model: nn.Module, samples: Iterable[dict], batch_size: int
) -> tuple[dict[str, Tensor], int]:
    """(F per trainable parameter name, mini-batches used): the module docstring's estimator."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    fisher = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    batches = 0
    for batch in _batches(samples, batch_size):
        tokens = sum(sum(1 for label in s["labels"][1:] if label != IGNORE_INDEX) for s in batch)
        if tokens == 0:
            continue
        model.zero_grad(set_to_none=True)
        for sample in batch:  # one sample at a time: no padding, the same sums
            (sample_loss_sum(model, sample) / tokens).backward()
        for name, param in params.items():
            if param.grad is not None:
                fisher[name] += param.grad.detach().float() ** 2
        batches += 1
    if batches == 0:
        raise UserError("ewc-fisher: the data has no loss tokens")
    return {n: f / batches for n, f in fisher.items()}, batches


def read_samples(data: Path, max_samples: int | None) -> Iterator[dict]:
    """The first `max_samples` samples (all: None) of a pre-tokenized JSONL file."""
    with open(data, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if max_samples is not None and number > max_samples:
                return
            try:
                record = json.loads(line)
                yield {"input_ids": list(record["input_ids"]), "labels": list(record["labels"])}
            except (ValueError, KeyError, TypeError) as error:
                raise UserError(f"{data}:{number}: not a tokenized sample ({error})") from None


def build_fisher(
    model_dir: Path,
    data: Path,
    out: Path,
    *,
    previous: Path | None = None,
    gamma: float = 1.0,
    batch_size: int = 8,
    max_samples: int | None = None,
) -> dict:
    """Compute the folder `out` for the weights in `model_dir` and the data `data`, on top of
    the `previous` stage's folder (online EWC); return its meta.json record."""
    # deferred: transformers (only this command loads a model)
    from transformers import AutoModelForCausalLM

    if not 0.0 <= gamma <= 1.0:
        raise UserError(f"--gamma: must be in [0, 1], got {gamma}")
    before = open_fisher(previous) if previous is not None else None
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()  # the training's mode (dropout as configured; the tiny models have none)
    fisher, batches = diagonal_fisher(model, read_samples(data, max_samples), batch_size)
    if before is not None:
        old, _ = before.tensors()
        missing = sorted(set(fisher) ^ set(old))
        if missing:
            raise UserError(f"--previous {previous}: other parameters ({', '.join(missing[:3])})")
        fisher = {n: gamma * old[n] + f for n, f in fisher.items()}
    params = dict(model.named_parameters())
    anchor = {n: params[n].detach().float().contiguous() for n in fisher}
    record = {
        "estimator": ESTIMATOR,
        "gamma": gamma,
        "stages": 1 + (before.meta["stages"] if before is not None else 0),
        "batch_size": batch_size,
        "batches": batches,
        "parameters": sum(f.numel() for f in fisher.values()),
        "model_hash": model_weights_hash(model_dir),
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out, is_dir=True) as tmp:  # made empty; renamed to `out` when complete
        save_file({n: f.contiguous() for n, f in fisher.items()}, tmp / FISHER_FILE)
        save_file(anchor, tmp / ANCHOR_FILE)
        record["files"] = {name: _file_hash(tmp / name) for name in (FISHER_FILE, ANCHOR_FILE)}
        record["checksum"] = _checksum(record)
        (tmp / FISHER_META).write_text(json.dumps(record, indent=2) + "\n")
    return record


# ---------------------------------------------------------------------------- reading


class FisherFolder:
    """An `ewc-fisher` folder whose files match their checksums."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta

    def tensors(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(Fisher, anchor), whole, by parameter name."""
        return _read_all(self.folder / FISHER_FILE), _read_all(self.folder / ANCHOR_FILE)

    def entries(self) -> tuple[dict[str, TensorEntry], dict[str, TensorEntry]]:
        """(Fisher, anchor) headers, to read one tensor at a time (`read_tensor`)."""
        return read_header(self.folder / FISHER_FILE), read_header(self.folder / ANCHOR_FILE)

    def check_model(self, model_dir: Path) -> None:
        """Refuse a folder taken at other weights than `model_dir`'s (the run's start)."""
        if self.meta["model_hash"] != model_weights_hash(model_dir):
            raise UserError(
                f"--ewc-fisher {self.folder}: taken at other weights than {model_dir} "
                "(compute it from the model this stage starts from)"
            )


def _read_all(path: Path) -> dict[str, Tensor]:
    return {name: read_tensor(entry) for name, entry in read_header(path).items()}


def open_fisher(folder: Path) -> FisherFolder:
    """The folder, its meta and files checked (one line per problem)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / FISHER_META).read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"{folder}/{FISHER_META}: not an ewc-fisher record ({error})") from None
    try:
        recorded, checksum = meta["files"], meta["checksum"]
        if checksum != _checksum(meta):
            raise UserError(f"{folder}/{FISHER_META}: checksum does not match its fields")
    except KeyError as error:
        raise UserError(f"{folder}/{FISHER_META}: missing {error}") from None
    for name in (FISHER_FILE, ANCHOR_FILE):
        path = folder / name
        if not path.is_file() or _file_hash(path) != recorded.get(name):
            raise UserError(f"{path}: missing or not the file {FISHER_META} records (corrupt?)")
    return FisherFolder(folder, meta)
