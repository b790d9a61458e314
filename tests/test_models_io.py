"""Streaming checkpoint I/O: the safetensors reader and writer against the safetensors library,
and (slow, real torchrun) loading and exporting against the whole-model code they replaced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import REPO_ROOT, subprocess_env, train_in_process
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file, save_file

from mini_trainer.errors import UserError
from mini_trainer.models.export import ShardedWriter, plan_shards
from mini_trainer.models.safetensors_file import checkpoint_tensors, read_header, read_tensor


def some_tensors(dtype):
    gen = torch.Generator().manual_seed(0)
    shapes = {"model.norm.weight": (8,), "lm_head.weight": (5, 8), "a.bias": (3,), "z": (2, 2, 2)}
    return {k: torch.randn(s, generator=gen).to(dtype) for k, s in shapes.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_writer_output_is_byte_identical_to_save_file(tmp_path, dtype):
    tensors = some_tensors(dtype)
    save_file(tensors, tmp_path / "reference.safetensors", metadata={"format": "pt"})
    specs = {name: (dtype, tuple(t.shape)) for name, t in tensors.items()}
    (shard,) = plan_shards(specs, max_shard_bytes=10**9)
    assert shard.filename == "model.safetensors"
    writer = ShardedWriter(tmp_path, [shard], {"format": "pt"})
    for name in reversed(list(tensors)):  # any order: each tensor goes to its planned offset
        writer.write(name, tensors[name].float())  # cast by the writer, as in the export
    writer.close()
    written = (tmp_path / "model.safetensors").read_bytes()
    assert written == (tmp_path / "reference.safetensors").read_bytes()


def test_shards_split_like_huggingface_hub(tmp_path):
    tensors = {f"layer{i}.weight": torch.full((10, 10), float(i)) for i in range(7)}
    specs = {name: (torch.float32, (10, 10)) for name in tensors}
    shards = plan_shards(specs, max_shard_bytes=1000)  # two 400-byte tensors per file
    split = split_torch_state_dict_into_shards(tensors, max_shard_size=1000)
    assert {s.filename: sorted(s.specs) for s in shards} == {
        name: sorted(keys) for name, keys in split.filename_to_tensors.items()
    }
    writer = ShardedWriter(tmp_path, shards, {"format": "pt"})
    for name, tensor in tensors.items():
        writer.write(name, tensor)
    writer.close()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == split.tensor_to_filename
    assert index["metadata"]["total_size"] == 7 * 400
    loaded = {}
    for shard in shards:
        loaded.update(load_file(tmp_path / shard.filename))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_writer_refuses_a_shape_it_did_not_plan(tmp_path):
    (shard,) = plan_shards({"w": (torch.float32, (2, 3))}, 10**9)
    writer = ShardedWriter(tmp_path, [shard], {"format": "pt"})
    with pytest.raises(RuntimeError, match=r"w came out with shape \[3, 2\], planned \[2, 3\]"):
        writer.write("w", torch.zeros(3, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reader_matches_load_file(tmp_path, dtype):
    tensors = {**some_tensors(dtype), "empty": torch.zeros((0, 4), dtype=dtype)}
    save_file(tensors, tmp_path / "model.safetensors")
    entries = checkpoint_tensors(tmp_path)
    assert set(entries) == set(tensors)
    for name, entry in entries.items():
        got = read_tensor(entry)
        assert got.dtype == dtype and torch.equal(got, tensors[name]), name


def test_reader_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match=f"{tmp_path}: no model.safetensors"):
        checkpoint_tensors(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00")
    with pytest.raises(UserError, match="model.safetensors: not a safetensors file"):
        read_header(tmp_path / "model.safetensors")


@pytest.mark.slow
def test_streaming_load_and_export_equal_the_whole_model_code(demo_dir):
    # 2 ranks under torchrun: byte-identical exports, weights equal to the checkpoint,
    # recomputed rotary buffers equal to from_pretrained's.
    result = subprocess.run(
        [sys.executable, "benchmarks/load_export.py", "--model", str(demo_dir / "model"),
         "--save-dtype", "float32"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=subprocess_env(), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "exports byte-identical, weights equal to the checkpoint, buffers equal" in result.stdout


@pytest.mark.slow
def test_a_weight_missing_from_the_checkpoint_is_one_clear_error(demo_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for path in (demo_dir / "model").iterdir():
        (model / path.name).write_bytes(path.read_bytes())
    weights = load_file(model / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, model / "model.safetensors")
    result = train_in_process(
        "--model-name-or-path", model, "--data-path", demo_dir / "data" / "sort.train.jsonl",
        "--output-dir", tmp_path / "run", "--max-tokens-per-gpu", 512, "--max-steps", 1,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        f"{model}: the weights do not match config.json: 1 weights missing from the checkpoint: "
        "model.layers.1.mlp.up_proj.weight" in result.stderr
    )
    assert "Traceback" not in result.stderr
