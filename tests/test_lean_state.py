"""Lean training state: `--optimizer` and `--param-dtype` (training/optimizer.py,
training/lean_adamw.py, training/lowbit_adamw.py, optimizer_options.py)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from helpers import (
    REPO_ROOT,
    base_flags,
    kill_when_saved,
    read_metrics,
    run_launcher,
    subprocess_env,
    train_in_process,
)
from safetensors.torch import load_file

from mini_trainer.errors import UserError
from mini_trainer.optimizer_options import layout_differences, state_layout
from mini_trainer.training.lean_adamw import LeanAdamW, stochastic_round_
from mini_trainer.training_args import TrainingArgs

REQUIRED = {"model_name_or_path": "m", "data_path": "d", "output_dir": "o"}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"optimizer": "adamw-4bit"}, "--optimizer adamw-4bit: torchao 0.18's AdamW4bit crashes"),
        ({"optimizer": "sgd"}, "--optimizer: unknown value 'sgd'"),
        ({"param_dtype": "fp16"}, "--param-dtype: unknown value 'fp16'"),
        (
            {"param_dtype": "bf16", "osft": True, "osft_unfreeze_rank_ratio": 0.5},
            "--param-dtype bf16: not with --osft",
        ),
    ],
)
def test_refused_combinations_are_one_line_each(options, expected):
    with pytest.raises(UserError) as error:
        TrainingArgs(**REQUIRED, **options)
    assert [line for line in str(error.value).splitlines() if expected in line]


def test_accepted_modes_compose_with_osft_offload_and_compile():
    for optimizer in ("adamw", "adamw-bf16", "adamw-8bit"):
        TrainingArgs(**REQUIRED, optimizer=optimizer, osft=True, osft_unfreeze_rank_ratio=0.5)
        TrainingArgs(**REQUIRED, optimizer=optimizer, param_dtype="bf16", cpu_offload=True,
                     compile=True, activation_checkpointing=True)  # fmt: skip


def test_the_flags_reach_the_job_through_run_training():
    from mini_trainer.api_train import build_command
    from mini_trainer.launch_args import TorchrunArgs, split_launcher_args
    from mini_trainer.training_args import parse_training_args

    args = TrainingArgs(**REQUIRED, optimizer="adamw-bf16", param_dtype="bf16")
    command = build_command(TorchrunArgs(nproc_per_node=2), args)
    _, train_argv = split_launcher_args(command[command.index("train") + 1 :])
    assert parse_training_args(train_argv) == args


def test_an_8bit_state_resumes_only_on_the_world_size_that_saved_it():
    args = types.SimpleNamespace(optimizer="adamw-8bit")
    saved = state_layout(args, 2)
    assert layout_differences(saved, state_layout(args, 2)) == []
    (line,) = layout_differences(saved, state_layout(args, 4))
    assert "saved by 2 ranks, this run has 4" in line
    # fp32 and bf16 states are whole-tensor elementwise: any world size resumes them
    plain = types.SimpleNamespace(optimizer="adamw-bf16")
    assert state_layout(plain, 2) == {} and layout_differences({}, state_layout(plain, 4)) == []


def test_stochastic_rounding_keeps_updates_that_rounding_to_nearest_loses():
    torch.manual_seed(0)
    start, update, steps = 1.0, 1e-4, 400  # bf16's spacing at 1.0 is 2^-7 = 0.0078
    nearest = torch.full((4096,), start, dtype=torch.bfloat16)
    stochastic = nearest.clone()
    for _ in range(steps):
        nearest += update
        stochastic_round_(stochastic, stochastic.float() + update)
    assert torch.all(nearest == start), "round to nearest should lose every update"
    expected = start + steps * update
    assert abs(stochastic.float().mean().item() - expected) < 2e-3 * expected


def test_bf16_moments_round_to_nearest_unless_their_decay_is_finer_than_bf16():
    """Default betas (0.9, 0.95): each moment is the fp32 value rounded to nearest. beta2 =
    0.999: rounding to nearest would keep a second moment with zero gradients where it is (a
    decay of 0.1% is under half of bf16's spacing); stochastic rounding decays it as fp32 does."""
    torch.manual_seed(2)
    grad = torch.randn(64, 64)
    param = torch.zeros(64, 64, requires_grad=True)
    optimizer = LeanAdamW([param], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                          state_dtype=torch.bfloat16)  # fmt: skip
    param.grad = grad.clone()
    optimizer.step()
    state = optimizer.state[param]
    assert torch.equal(state["exp_avg"], (0.1 * grad).to(torch.bfloat16))
    assert torch.equal(state["exp_avg_sq"], grad.mul(grad).mul_(1 - 0.95).to(torch.bfloat16))

    optimizer = LeanAdamW([param], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                          state_dtype=torch.bfloat16)  # fmt: skip
    param.grad = grad.clone()
    optimizer.step()
    start = optimizer.state[param]["exp_avg_sq"].float().sum()
    param.grad = torch.zeros_like(grad)
    for _ in range(50):
        optimizer.step()
    decayed = optimizer.state[param]["exp_avg_sq"].float().sum() / start
    assert decayed.item() == pytest.approx(0.999**50, rel=2e-3)  # nearest would leave 1.0


def test_lean_adamw_with_fp32_states_is_torch_adamw():
    torch.manual_seed(1)
    weights = [torch.randn(64, 32), torch.randn(32)]
    ours = [w.clone().requires_grad_() for w in weights]
    theirs = [w.clone().requires_grad_() for w in weights]
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    mine, torchs = LeanAdamW(ours, **kwargs), torch.optim.AdamW(theirs, **kwargs)
    for _ in range(5):
        grads = [torch.randn_like(w) for w in weights]
        for params, opt in ((ours, mine), (theirs, torchs)):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.fixture
def uncompiled_8bit_update(monkeypatch):
    """torchao's 8-bit update run uncompiled in this process: compiling it cost a test worker
    about 30 CPU-s, and what these tests check (bytes, resume) does not depend on it. The
    compiled update is checked once, on one shape (the test below)."""
    from torchao.optim.adam import single_param_adam

    from mini_trainer.training import lowbit_adamw

    monkeypatch.setattr(lowbit_adamw, "_compiled_update", lambda: single_param_adam)


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_8bit_update_is_the_eager_one(param_dtype, monkeypatch):
    """What a training run steps with (`_compiled_update()`: torchao's update under
    torch.compile, fullgraph) against the same update run eagerly, through our optimizer's own
    step (float lr, local shards), on one 8-bit-sized parameter: the same weights to
    rounding, and moments stored in 8-bit blocks by both. bf16 parameters take torchao's
    stochastic rounding, whose random bits differ between the two: there the updates are
    compared by direction."""
    from torchao.optim.adam import single_param_adam

    from mini_trainer.training import lowbit_adamw

    torch.manual_seed(3)
    start = (0.1 * torch.randn(64, 128)).to(param_dtype)  # bf16 spacing well under the update
    grads = [torch.randn(64, 128).to(param_dtype) for _ in range(3)]
    ends = []
    for update in (lowbit_adamw._compiled_update(), single_param_adam):
        assert (update is single_param_adam) == (len(ends) == 1), "the first is not compiled"
        param = start.clone().requires_grad_()
        optimizer = lowbit_adamw.AdamW8bit([param], lr=1e-2, weight_decay=0.1)
        optimizer.bf16_stochastic_round = True
        monkeypatch.setattr(lowbit_adamw, "_compiled_update", lambda u=update: u)
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
        state = optimizer.state[param]
        assert type(state["exp_avg"]).__name__ == "OptimState8bit"
        ends.append(param.detach().float())
    compiled, eager = (end - start.float() for end in ends)
    assert eager.abs().mean() > 1e-2  # three steps of lr 1e-2 moved the weights
    if param_dtype == torch.float32:
        torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
    else:  # the same updates up to the rounding's random bits
        assert torch.cosine_similarity(compiled.flatten(), eager.flatten(), dim=0) > 0.99


MODES = [
    ("adamw-bf16", "fp32"),
    ("adamw", "bf16"),
    ("adamw-bf16", "bf16"),
    ("adamw-8bit", "fp32"),
    ("adamw-8bit", "bf16"),
]
"""Every mode but the default (whose SIGKILL test is test_train.py's)."""


@pytest.mark.slow
@pytest.mark.parametrize(("optimizer", "param_dtype"), MODES)
def test_every_mode_resumes_bit_identically_after_sigkill(
    demo_dir, tmp_path, optimizer, param_dtype, uncompiled_8bit_update
):
    """A run SIGKILLed once it published its step-2 state, then resumed, ends with the weights
    of the uninterrupted run, bit for bit, through the same run folder, checksums and
    torch.distributed.checkpoint path as the default mode. One rank: the uninterrupted and the
    resumed run in this process, the killed one a process of its own. torchao's 8-bit update
    runs uncompiled on both sides (the fixture here, TORCH_COMPILE_DISABLE in the child: the
    compile costs about 30 CPU-s a process; the 2-rank 8-bit test runs it compiled); the 8-bit
    state's world-size rule is the test above."""
    flags = {"training-mode": "step", "max-steps": 8, "save-every-steps": 2, "batch-size": 8,
             "max-tokens-per-gpu": 256, "save-final-checkpoint": True, "optimizer": optimizer,
             "param-dtype": param_dtype}  # fmt: skip
    straight = tmp_path / "straight"
    result = train_in_process(*base_flags(demo_dir, straight, **flags))
    assert result.returncode == 0, result.stderr
    killed = tmp_path / "killed"
    argv = [sys.executable, "-m", "mini_trainer.train",
            *map(str, base_flags(demo_dir, killed, **flags))]  # fmt: skip
    kill_when_saved(argv, killed / "state" / "step_2", env={"TORCH_COMPILE_DISABLE": "1"})
    result = train_in_process(*base_flags(demo_dir, killed, **flags, resume=True))
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stderr
    assert [row["step"] for row in read_metrics(killed)] == list(range(1, 9))
    before, after = (load_file(out / "final" / "model.safetensors") for out in (straight, killed))
    base = load_file(demo_dir / "model" / "model.safetensors")
    assert any(not torch.equal(before[k], base[k]) for k in base), "nothing trained"
    for key in before:
        assert torch.equal(before[key], after[key]), key
    # the export (--save-dtype float32 here, bf16 weights upcast exactly) loads in transformers
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(killed / "final").state_dict()
    assert all(torch.equal(loaded[key], after[key]) for key in after)


def test_bf16_params_are_stored_in_bf16_and_computed_in_fp32_on_the_cpu(demo_dir):
    """On the CPU `--param-dtype bf16` changes what it changes on a GPU, the stored weights and
    gradients, and not the step's arithmetic: FSDP2 gathers the bf16 shards as fp32
    (`optimizer_options.bf16_compute`), and the gradients come back to bf16 shards."""
    from mini_trainer.distributed.runtime import init_runtime, shutdown
    from mini_trainer.method import FullFineTuning
    from mini_trainer.training.loss import make_loss_fn
    from mini_trainer.training.model_setup import ModelSpec, build_model, decoder_layers

    runtime = init_runtime()
    try:
        spec = ModelSpec(str(demo_dir / "model"), param_dtype="bf16")
        wrapped, _ = build_model(spec, make_loss_fn(False, "cpu"), runtime, FullFineTuning())
        seen = []
        layer = decoder_layers(wrapped.model)[0]
        layer.mlp.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
        ids = torch.randint(3, 50, (1, 16))
        positions = torch.arange(16).unsqueeze(0)
        wrapped(ids, positions, torch.roll(ids, -1, dims=1)).backward()
    finally:
        shutdown()
    assert seen == [torch.float32]
    assert {p.to_local().dtype for p in wrapped.parameters()} == {torch.bfloat16}
    assert {p.grad.to_local().dtype for p in wrapped.parameters()} == {torch.bfloat16}
    assert all(p.grad.to_local().abs().sum() > 0 for p in wrapped.parameters())


@pytest.mark.parametrize(
    ("optimizer", "param_dtype"),
    [("adamw", "fp32"), ("adamw-bf16", "fp32"), ("adamw", "bf16"), ("adamw-8bit", "fp32")],
)
def test_plan_counts_the_state_the_real_optimizer_builds(
    optimizer, param_dtype, uncompiled_8bit_update
):
    from mini_trainer.plan.optimizer_state import state_bytes, tensor_bytes
    from mini_trainer.training.optimizer import optimizer_class

    torch.manual_seed(0)
    model = torch.nn.Linear(128, 64)  # weight: 8,192 elements (8-bit blocks), bias: 64 (fp32)
    args = TrainingArgs(**REQUIRED, optimizer=optimizer, param_dtype=param_dtype)
    planned = state_bytes(model, args, world=1)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[param_dtype]
    params = [p.detach().to(dtype).requires_grad_() for p in model.parameters()]
    real = optimizer_class(args)(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    for param in params:
        param.grad = torch.randn_like(param)
    real.step()
    measured = sum(tensor_bytes(v) for state in real.state.values() for v in state.values())
    assert planned == measured
    fp32_adamw = 2 * 4 * (128 * 64 + 64) + 2 * 4  # two fp32 moments and a step per parameter
    ratio = {"adamw": 1.0, "adamw-bf16": 0.5}.get(optimizer)
    if ratio is not None:
        assert measured == pytest.approx(ratio * fp32_adamw, abs=8)
    else:  # 8-bit codes + one fp32 scale per 256 + the 256-entry code table, per moment
        assert measured < 0.3 * fp32_adamw


def test_the_8bit_state_layout_follows_the_shard_size():
    from mini_trainer.plan.optimizer_state import state_bytes

    args = TrainingArgs(**REQUIRED, optimizer="adamw-8bit")
    model = torch.nn.Linear(128, 64, bias=False)  # 8,192 elements
    per_rank = {world: state_bytes(model, args, world) for world in (1, 2, 4)}
    assert per_rank[2] < 0.6 * per_rank[1]  # 4,096 per shard: still 8-bit (half the codes)
    assert per_rank[4] > per_rank[2]  # 2,048 per shard: torchao keeps fp32 state


PLAN_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "plan"


@pytest.mark.parametrize(
    ("model", "gpus", "tokens", "mode", "fits"),
    [
        ("llama-3.1-70b", 8, 8192, [], False),
        ("llama-3.1-70b", 8, 8192, ["--optimizer", "adamw-8bit", "--param-dtype", "bf16"], True),
        ("llama-3.1-8b", 1, 16384, [], False),
        ("llama-3.1-8b", 1, 16384, ["--optimizer", "adamw-8bit", "--param-dtype", "bf16"], True),
    ],
)
def test_plan_verdicts_of_docs_plan_md(model, gpus, tokens, mode, fits):
    from mini_trainer.plan.inputs import Cluster, make_plan

    cluster = Cluster(nodes=1, gpus_per_node=gpus, gpu_memory_gib=80, device="cuda")
    flags = ["--max-tokens-per-gpu", str(tokens), "--activation-checkpointing", *mode]
    plan = make_plan(str(PLAN_FIXTURES / model), None, cluster, [*flags, "--batch-size", "8"])
    assert plan["per_gpu"]["fits"] is fits


@pytest.mark.slow
def test_8bit_on_two_ranks_with_uneven_shards_and_a_resume_on_one_rank_refused(demo_dir, tmp_path):
    """The demo model's 281-row embedding splits 141/140 over 2 ranks: torchao's own step fails
    there (lowbit_adamw.py runs it on local shards). The state then resumes only on 2 ranks."""
    out = tmp_path / "run"
    flags = {"training-mode": "step", "max-steps": 3, "save-every-steps": 2, "batch-size": 8,
             "max-tokens-per-gpu": 256, "optimizer": "adamw-8bit"}  # fmt: skip
    # uncompiled: a compile per shard shape in both ranks cost about 60 CPU-s, and the compiled
    # update is checked in this process (test_the_compiled_8bit_update_is_the_eager_one)
    result = run_launcher(*base_flags(demo_dir, out, **flags),
                          env=subprocess_env(TORCH_COMPILE_DISABLE="1"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["step"] for row in read_metrics(out)] == [1, 2, 3]
    result = train_in_process(*base_flags(demo_dir, out, **flags, resume=True))  # one rank
    assert result.returncode == 2, result.stderr[-3000:]
    assert "the state was saved by 2 ranks, this run has 1" in result.stderr
