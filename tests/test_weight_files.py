"""Weight files that are not whole safetensors files: one line naming the file, exit 2, before
anything is allocated, in the reader itself and in every subcommand that reads weights."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from helpers import base_flags, run_cli
from safetensors.torch import load_file, save_file

from mini_trainer.errors import UserError
from mini_trainer.models.safetensors_file import checkpoint_tensors, read_header

LFS_TEXT = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    "size 1048576\n"
)


def _one_error(excinfo) -> str:
    assert len(excinfo.value.lines) == 1, excinfo.value.lines
    return excinfo.value.lines[0]


def test_a_git_lfs_pointer_is_named_as_such(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_text(LFS_TEXT)
    with pytest.raises(UserError) as excinfo:
        read_header(path)
    assert _one_error(excinfo) == f"{path} is a git-lfs pointer, not weights: run git lfs pull"


def test_random_bytes_give_one_line_without_allocating(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 2**62) + bytes(range(256)) * 16)  # a 4 EiB "header"
    with pytest.raises(UserError) as excinfo:
        read_header(path)
    assert _one_error(excinfo).startswith(f"{path}: not a safetensors file (its header length")


def test_a_header_that_is_not_json(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 8) + b"\xff{nope}\x00" + b"\x00" * 16)
    with pytest.raises(UserError, match="its header is not JSON"):
        read_header(path)


def test_offsets_outside_the_file_and_inconsistent_sizes(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4, 4)}, path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])
    with pytest.raises(UserError, match=rf"{path}: truncated \(\d+ bytes, but tensor w ends at"):
        read_header(path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}})
    header += " " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(64))
    with pytest.raises(UserError, match=r"w: data offsets \[0, 60\] do not hold a F32 tensor"):
        read_header(path)


def _sharded_copy(model, out):
    """The model folder with its weights split into two shards and an index, as the Hub has it."""
    shutil.copytree(model, out)
    weights = load_file(out / "model.safetensors")
    (out / "model.safetensors").unlink()
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
    weight_map = {}
    for file, part in halves.items():
        save_file({name: weights[name] for name in part}, out / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


def test_the_locator_reads_a_sharded_index_like_a_single_file(demo_model, tmp_path):
    sharded = _sharded_copy(demo_model, tmp_path / "sharded")
    single = checkpoint_tensors(demo_model)
    split = checkpoint_tensors(sharded)
    assert set(split) == set(single)
    assert {entry.file.name for entry in split.values()} == {
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    }  # fmt: skip


def _bad_model(kind, demo_model, folder):
    """A copy of the demo model whose weights are `kind`; returns (folder, the bad file)."""
    if kind == "truncated shard":
        model = _sharded_copy(demo_model, folder)
        bad = model / "model-00002-of-00002.safetensors"
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
        return model, bad
    model = shutil.copytree(demo_model, folder)
    bad = model / "model.safetensors"
    size = bad.stat().st_size
    if kind == "random bytes":
        bad.write_bytes(torch.randint(0, 256, (size,), generator=torch.Generator().manual_seed(0),
                                      dtype=torch.uint8).numpy().tobytes())  # fmt: skip
    else:
        bad.write_text(LFS_TEXT)
    return model, bad


def _command(subcommand, model, tmp_path, demo_dir):
    data = demo_dir / "data" / "sort.eval.jsonl"
    train = base_flags(demo_dir, tmp_path / "run", **{"model-name-or-path": model})
    return {
        "train": ["train", *train],
        "train --nproc-per-node": ["train", "--nproc-per-node", "2", *train],
        "launch": ["launch", "--nproc-per-node", "2", "--", *train],
        "evaluate": ["evaluate", "--model", model, "--data", data, "--out", tmp_path / "e.json"],
        "osft-svd": ["osft-svd", "--model", model, "--out", tmp_path / "svd"],
    }[subcommand]


@pytest.mark.parametrize("kind", ["truncated shard", "random bytes", "git-lfs pointer"])
@pytest.mark.parametrize(
    "subcommand", ["train", "train --nproc-per-node", "launch", "evaluate", "osft-svd"]
)
def test_every_subcommand_that_reads_weights_refuses_a_bad_file_in_one_line(
    demo_dir, tmp_path, subcommand, kind
):
    model, bad = _bad_model(kind, demo_dir / "model", tmp_path / "model")
    result = run_cli(*_command(subcommand, model, tmp_path, demo_dir))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line
             and not line.startswith("mini-trainer launch (")]  # fmt: skip
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}"), result.stderr
    if kind == "git-lfs pointer":
        assert lines[0] == f"error: {bad} is a git-lfs pointer, not weights: run git lfs pull"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # nothing written
