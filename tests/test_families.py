"""Every supported family trains exactly in packed rows: the step-1 loss and every gradient of
our sharded model (FSDP2, our loader, our per-sample attention, our chunked loss) equal
transformers' eager per-sample computation, fp32 on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from families import (
    FAMILIES,
    RTOL,
    build_model,
    eager_reference,
    full_grads,
    relative_error,
    samples,
    sharded_step,
    worst_errors,
)
from helpers import REPO_ROOT, subprocess_env
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from mini_trainer.training.checkpoint import save_hf_checkpoint


@pytest.mark.parametrize("name", [family.name for family in FAMILIES])
def test_packed_step_equals_transformers_eager_per_sample(name, tmp_path, world_of_one):
    """One rank: loss and every gradient; then the export, reloaded by transformers."""
    model = build_model(name)
    model.save_pretrained(tmp_path / "model")
    batch = samples(model.config.vocab_size)
    want_loss, want_grads = eager_reference(model, batch)

    wrapped, loss = sharded_step(tmp_path / "model", batch, world_of_one)
    assert relative_error(loss, want_loss) <= RTOL, (loss.item(), want_loss.item())
    worst = worst_errors(full_grads(wrapped, 1), want_grads)
    assert worst[0][1] <= RTOL, worst

    # Export: the checkpoint's own key layout and shapes (per-expert tensors again), and
    # transformers loads it to the same logits.
    save_hf_checkpoint(wrapped, model.config, str(tmp_path / "model"), tmp_path / "out",
                       "float32", world_of_one)  # fmt: skip
    assert _shapes(tmp_path / "out") == _shapes(tmp_path / "model")
    assert_reloads_to_the_same_logits(tmp_path / "out", model, batch[2]["input_ids"])


@pytest.mark.slow
def test_every_family_is_exact_on_two_ranks(tmp_path):
    """Two ranks (torchrun, gloo, FSDP2 shards on both), each packing half the samples: the
    summed loss and every whole gradient equal the single-process eager reference."""
    out = tmp_path / "errors.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", str(REPO_ROOT / "tests" / "family_ranks.py"),
               str(out), str(tmp_path / "models")]  # fmt: skip
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(out.read_text())
    assert sorted(errors) == sorted(family.name for family in FAMILIES)
    for name, (loss_error, worst) in errors.items():
        assert loss_error <= RTOL, (name, loss_error)
        assert worst[0][1] <= RTOL, (name, worst)


def assert_reloads_to_the_same_logits(folder, model, input_ids: list[int]) -> None:
    """transformers loads the exported `folder` to the logits `model` gives."""
    reloaded = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        want_logits = model(input_ids=ids, use_cache=False).logits
        got_logits = reloaded.eval()(input_ids=ids, use_cache=False).logits
    assert relative_error(got_logits, want_logits) <= RTOL


def _shapes(folder) -> dict[str, tuple]:
    with safe_open(folder / "model.safetensors", "pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "gpt_oss", "granitemoe"])
def test_router_aux_loss_enters_the_loss_as_the_family_defines_it(name, tmp_path, world_of_one):
    """With `output_router_logits` on, the step's loss is the LM token sum plus
    `router_aux_loss_coef * loss tokens * load_balancing_loss_func(router logits of the row)`
    (the family's own function; packed routing is per token, so the row's logits are the
    samples' logits laid end to end), and so are the gradients; counts per expert add up."""
    from mini_trainer.models.moe import RouterStats, routing

    # a large coefficient, so the term moves every gradient
    model = build_model(name, output_router_logits=True, router_aux_loss_coef=0.5)
    model.save_pretrained(tmp_path / "model")
    batch = samples(model.config.vocab_size)
    routes = routing(model)
    assert routes is not None and routes.aux_coef == 0.5

    model.zero_grad(set_to_none=True)
    lm_sum, logits, tokens = 0.0, [], 0
    for sample in batch:
        ids, labels = torch.tensor([sample["input_ids"]]), torch.tensor([sample["labels"]])
        out = model(input_ids=ids, labels=labels, use_cache=False, output_router_logits=True)
        n = int((labels[0, 1:] != -100).sum())
        # transformers adds its own aux term per sample: take the LM part alone
        lm_sum = lm_sum + (out.loss - 0.5 * out.aux_loss) * n
        logits.append(out.router_logits)
        tokens += n
    row_logits = tuple(torch.cat(layer) for layer in zip(*logits, strict=True))
    aux = routes.loss_fn(row_logits, routes.experts, routes.top_k, None)
    want = lm_sum + 0.5 * tokens * aux
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    stats = RouterStats(routes, torch.device("cpu"))
    wrapped, loss = sharded_step(tmp_path / "model", batch, world_of_one, router=stats)
    assert relative_error(loss, want.detach()) <= RTOL
    worst = worst_errors(full_grads(wrapped, 1), want_grads)
    assert worst[0][1] <= RTOL, worst
    assert stats.totals[0].item() == pytest.approx(tokens * aux.item(), rel=1e-5)
    routed_layers = len(row_logits)
    assert stats.totals[2:].sum().item() == sum(len(s["input_ids"]) for s in batch) * (
        routes.top_k * routed_layers
    )


def test_the_docs_table_is_generated_from_the_family_list():
    import importlib.util

    path = REPO_ROOT / "scripts" / "families_table.py"
    spec = importlib.util.spec_from_file_location("families_table", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = script.DOC.read_text()
    assert script.with_table(doc, script.table()) == doc, "run scripts/families_table.py --write"


UNSUPPORTED = {
    "t5": ("T5Config", "not a causal language model"),
    "mamba": ("MambaForCausalLM", "mixes tokens without attention"),
    "jamba": ("JambaForCausalLM", "mixes tokens without attention"),
    "gemma3": ("Gemma3Config", "a multimodal model"),
    "falcon": ("FalconForCausalLM", "does not take a registered implementation"),
}


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_a_model_that_cannot_be_trained_exactly_is_refused_in_one_line(model_type, tmp_path):
    """Through `plan` (the cheapest command that builds the model): exit 2, one line naming
    the model class and what it lacks, no traceback."""
    import transformers as tf
    from helpers import run_cli

    small = {"vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 2}
    config = {
        "t5": lambda: tf.T5Config(vocab_size=97, d_model=32, num_layers=2, num_heads=4),
        "mamba": lambda: tf.MambaConfig(**small),
        "jamba": lambda: tf.JambaConfig(**small, num_attention_heads=4, num_experts=4),
        "gemma3": lambda: tf.Gemma3Config(text_config={**small, "num_attention_heads": 4}),
        "falcon": lambda: tf.FalconConfig(**small, num_attention_heads=4),
    }[model_type]()
    config.save_pretrained(tmp_path)
    result = run_cli("plan", "--model", tmp_path, "--gpus-per-node", "1",
                     "--gpu-memory-gib", "80", "--max-tokens-per-gpu", "64")  # fmt: skip
    name, reason = UNSUPPORTED[model_type]
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and name in lines[0] and reason in lines[0], result.stderr


def test_gpt_oss_mxfp4_experts_are_dequantized_on_load_and_exported_dense(tmp_path, world_of_one):
    """An MXFP4 checkpoint of gpt-oss (experts as `_blocks` and `_scales`, a quantization
    config): the step equals the eager reference holding transformers' own dequantization of
    the same bytes; the export is dense, with the dense model's keys and no quantization
    config, and transformers reloads it to the same logits."""
    from families import mxfp4_quantize
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = build_model("gpt_oss")
    model.save_pretrained(tmp_path / "dense")
    tensors = load_file(tmp_path / "dense" / "model.safetensors")
    quantized = {}
    for key, value in tensors.items():
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = mxfp4_quantize(value.transpose(1, 2))  # stored (E, out, in)
            quantized[f"{key}_blocks"], quantized[f"{key}_scales"] = blocks, scales
            dense = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            assert relative_error(dense, value) < 0.2  # 4-bit: close, not equal
            with torch.no_grad():
                model.get_parameter(key).copy_(dense)
        else:
            quantized[key] = value
    folder = tmp_path / "mxfp4"
    model.config.quantization_config = {"quant_method": "mxfp4"}
    model.config.save_pretrained(folder)
    del model.config.quantization_config
    save_file(quantized, folder / "model.safetensors", metadata={"format": "pt"})

    batch = samples(model.config.vocab_size)
    want_loss, want_grads = eager_reference(model, batch)
    wrapped, loss = sharded_step(folder, batch, world_of_one)
    assert relative_error(loss, want_loss) <= RTOL
    worst = worst_errors(full_grads(wrapped, 1), want_grads)
    assert worst[0][1] <= RTOL, worst

    save_hf_checkpoint(wrapped, wrapped.model.config, str(folder), tmp_path / "out", "float32",
                       world_of_one)  # fmt: skip
    assert _shapes(tmp_path / "out") == _shapes(tmp_path / "dense")
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())
    assert_reloads_to_the_same_logits(tmp_path / "out", model, batch[2]["input_ids"])
