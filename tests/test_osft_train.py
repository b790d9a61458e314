"""OSFT end to end: real torchrun, gloo, FSDP2 on CPU, the demo model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import (
    REPO_ROOT,
    base_flags,
    kill_when_saved,
    read_metrics,
    run_cli,
    run_torchrun,
    subprocess_env,
    train_in_process,
)
from safetensors.torch import load_file
from test_train import assert_weights_close, final_weights

pytestmark = pytest.mark.slow
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def osft_flags(demo_dir, out, **overrides):
    flags = {"osft": True, "osft-unfreeze-rank-ratio": 0.25, "batch-size": 8,
             "max-tokens-per-gpu": 256, "training-mode": "step", "max-steps": 3,
             "save-final-checkpoint": True}  # fmt: skip
    return base_flags(demo_dir, out, task="sort", **{**flags, **overrides})


def targets_of(weights):
    return [k for k in weights if k.endswith(".weight") and any(p in k for p in PROJECTIONS)]


@pytest.fixture(scope="module")
def svd_cache(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("osft") / "cache"
    result = run_cli("osft-svd", "--model", demo_dir / "model", "--out", out, check=True)
    assert "28 targets" in result.stdout
    return out


def cached_factors(cache):
    factors = {}
    for path in cache.glob("factors-*.safetensors"):
        factors.update(load_file(path))
    return factors


def test_frozen_subspace_held_after_50_steps_on_1_and_2_ranks(demo_dir, tmp_path, svd_cache):
    flags = {"max-steps": 50, "weight-decay": 0.1, "osft-svd-cache": svd_cache,
             "save-every-steps": 50}  # fmt: skip
    runs = {}
    for nproc in (1, 2):  # one rank in this process (the same job without torchrun's start-up)
        out = tmp_path / f"ranks{nproc}"
        if nproc == 1:
            assert train_in_process(*osft_flags(demo_dir, out, **flags)).returncode == 0
        else:
            run_torchrun(*osft_flags(demo_dir, out, **flags), nproc=nproc)
        runs[nproc] = final_weights(out)
    factors = cached_factors(svd_cache)
    base = load_file(demo_dir / "model" / "model.safetensors")
    for name in targets_of(base):
        module = name.removesuffix(".weight")
        u, s, v = (factors[f"{module}.{part}"].double() for part in "USV")
        k = int(0.75 * len(s))
        before = base[name].double()  # W_high + U_low S_low V_lowᵀ start as the weight itself
        for nproc, weights in runs.items():
            delta = weights[name].double() - before
            assert delta.norm() > 1e-3 * before.norm(), f"{name} did not train ({nproc} ranks)"
            assert (u[:, :k].T @ delta).norm() < 1e-5 * delta.norm(), (name, nproc)
            assert (delta @ v[:, :k]).norm() < 1e-5 * delta.norm(), (name, nproc)
    assert_weights_close(runs[2], runs[1], rtol=1e-4)

    # final/ holds the dense weights of the factorized training model: same logits.
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from mini_trainer.osft.method import OSFT
    from mini_trainer.training_args import TrainingArgs

    args = TrainingArgs(model_name_or_path=str(demo_dir / "model"), data_path="d",
                        output_dir=str(tmp_path / "probe"), osft=True,
                        osft_unfreeze_rank_ratio=0.25)  # fmt: skip
    factorized = AutoModelForCausalLM.from_pretrained(demo_dir / "model")
    OSFT(args).adapt_model(factorized)
    state = {"model": {f"model.{k}": v for k, v in factorized.state_dict().items()}}
    dcp.load(state, checkpoint_id=str(tmp_path / "ranks2" / "state" / "step_50"))
    factorized.load_state_dict({k.removeprefix("model."): v for k, v in state["model"].items()})
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "ranks2" / "final")
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        torch.testing.assert_close(
            exported(ids).logits, factorized(ids, use_cache=False).logits, rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("mode", ["frozen", "full", "adaptive"])
def test_ratio_zero_ratio_one_and_adaptive_whole_jobs(demo_dir, tmp_path, mode):
    """Whole one-rank jobs, in this process (`python -m mini_trainer.train`'s code path)."""
    flags = {
        "frozen": {"osft-unfreeze-rank-ratio": 0.0},
        "full": {"osft-unfreeze-rank-ratio": 1.0},
        "adaptive": {"osft-unfreeze-rank-ratio": None, "osft-rank-mode": "adaptive"},
    }[mode]
    out = tmp_path / mode
    result = train_in_process(*osft_flags(demo_dir, out, **flags))
    assert result.returncode == 0, result.stderr
    base = load_file(demo_dir / "model" / "model.safetensors")
    final = final_weights(out)
    ranks = json.loads((out / "osft_ranks.json").read_text())
    assert len(ranks["targets"]) == 28
    moved = {name: not torch.equal(final[name], base[name]) for name in targets_of(base)}
    if mode == "frozen":
        assert not any(moved.values()), "a target trained at ratio 0.0"
        assert not torch.equal(final["model.norm.weight"], base["model.norm.weight"])
        assert {t["frozen"] == t["rank"] for t in ranks["targets"].values()} == {True}
    elif mode == "full":
        assert all(moved.values()), [n for n, m in moved.items() if not m]
        assert {t["frozen"] for t in ranks["targets"].values()} == {0}
    else:
        assert all(moved.values())
        fractions = [layer["frozen_fraction"] for layer in ranks["layers"].values()]
        assert all(0.1 <= f <= 0.8 for f in fractions) and len(fractions) == 4
        assert "importance" in result.stderr


def test_train_refuses_a_cache_of_other_patterns(demo_dir, tmp_path):
    cache = tmp_path / "cache"
    run_cli("osft-svd", "--model", demo_dir / "model", "--out", cache,
            "--target-patterns", "q_proj,v_proj", check=True)  # fmt: skip
    out = tmp_path / "run"
    result = train_in_process(*osft_flags(demo_dir, out, **{"osft-svd-cache": cache}))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {cache}/meta.json: patterns: the cache was built for patterns "
        "['q_proj', 'v_proj'], this run targets the default targets (rebuild it with osft-svd)"
    ]
    assert not (out / "metrics.jsonl").exists()


def test_osft_resume_after_sigkill_matches_uninterrupted_run(demo_dir, tmp_path):
    """One rank: the killed job a child (`python -m mini_trainer.train`), the uninterrupted and
    the resumed ones in this process. OSFT's SIGKILL and resume on 2 ranks (FSDP2-sharded
    factors): tests/test_compile.py's compiled resume test."""
    flags = {"max-steps": 32, "batch-size": 16, "weight-decay": 0.1}  # steps to kill it in
    straight = tmp_path / "straight"
    assert train_in_process(*osft_flags(demo_dir, straight, **flags)).returncode == 0

    killed = tmp_path / "killed"
    argv = [sys.executable, "-m", "mini_trainer.train",
            *osft_flags(demo_dir, killed, **flags, **{"save-every-steps": 4})]  # fmt: skip
    kill_when_saved(argv, killed / "state" / "step_4")

    resumed = {"save-every-steps": 4, "resume": True}
    result = train_in_process(*osft_flags(demo_dir, killed, **flags, **resumed))
    assert result.returncode == 0, result.stderr
    resumed_at = int(result.stderr.split("resumed from ")[1].split("(step ")[1].split(")")[0])
    assert 4 <= resumed_at < 32
    assert [r["step"] for r in read_metrics(killed)] == list(range(1, 33))
    assert_weights_close(final_weights(killed), final_weights(straight), rtol=1e-6)


def test_osft_svd_split_over_two_ranks_equals_one_process(demo_dir, tmp_path, svd_cache):
    """Splitting the targets over ranks changes nothing: the 2-rank cache equals a one-process
    cache computed with the same BLAS thread count (torchrun gives each worker one thread) bit
    for bit. Against the multi-threaded fixture cache (LAPACK's sums depend on the thread count)
    the singular values agree to float32 rounding; singular vectors of nearly equal values are
    not determined that finely, so they are not compared."""
    out = tmp_path / "cache2"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "mini_trainer", "osft-svd", "--model", demo_dir / "model", "--out", out],
        capture_output=True, text=True, env=subprocess_env(), cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.glob("factors-*")) == [
        "factors-00000-00000.safetensors",
        "factors-00001-00000.safetensors",
    ]
    single = tmp_path / "cache1"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # in this process, one BLAS thread like each torchrun worker
    try:
        run_cli("osft-svd", "--model", demo_dir / "model", "--out", single, check=True)
    finally:
        torch.set_num_threads(threads)
    one, two = cached_factors(single), cached_factors(out)
    assert one.keys() == two.keys() and len(one) == 28 * 3
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=0)
    threaded = cached_factors(svd_cache)
    assert threaded.keys() == one.keys()
    for key in [key for key in one if key.endswith(".S")]:
        torch.testing.assert_close(threaded[key], one[key], rtol=1e-5, atol=1e-6)
    meta = [json.loads((cache / "meta.json").read_text()) for cache in (svd_cache, out)]
    assert meta[0]["source_hash"] == meta[1]["source_hash"]
    assert not list(tmp_path.glob(".cache2.tmp-*")), "the temporary folder was left behind"


def test_mixture_of_experts_osft_on_two_ranks_holds_every_experts_subspace(demo_dir, tmp_path):
    """A tiny Mixtral (2 of 4 experts) with OSFT on 2 ranks: FSDP2 shards the factorized
    experts by experts, and each expert's projection is local; after 3 steps no expert's
    update enters its own frozen subspace, and final/ is in the checkpoint's per-expert
    layout."""
    import shutil

    from families import build_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from mini_trainer.osft import svd

    vocab = AutoConfig.from_pretrained(demo_dir / "model").vocab_size
    folder = tmp_path / "mixtral"
    build_model("mixtral", vocab_size=vocab).save_pretrained(folder)
    for tokenizer_file in (demo_dir / "model").glob("*token*"):
        shutil.copy(tokenizer_file, folder)
    out = tmp_path / "run"
    flags = {"model-name-or-path": folder, "max-steps": 3, "weight-decay": 0.1}
    run_torchrun(*osft_flags(demo_dir, out, **flags), nproc=2)
    assert load_file(out / "final" / "model.safetensors").keys() == (
        load_file(folder / "model.safetensors").keys()
    )
    base = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    checked = 0
    for key in base:
        if not key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        u, s, v = (t.double() for t in svd.thin_svd(base[key], torch.device("cpu")))
        k = svd.frozen_rank(s.shape[-1], 0.75)
        delta = trained[key].double() - base[key].double()
        assert delta.norm() > 1e-3 * base[key].norm(), f"{key} did not train"
        # 1e-4: 3 small steps, so the export's fp32 rounding of W (~1e-7 of |W|) is a larger
        # share of the update than in the 50-step test above (the bound is 1e-3)
        assert (u[..., :k].mT @ delta).norm() < 1e-4 * delta.norm(), key
        assert (delta @ v[..., :k]).norm() < 1e-4 * delta.norm(), key
        checked += 1
    assert checked == 4


def test_mixture_of_experts_osft_resumes_bit_identically(demo_dir, tmp_path):
    """OSFT on a tiny Mixtral with activation checkpointing, one rank in this process: a run
    resumed from its step-1 state (the factorized experts go through torch.distributed
    .checkpoint like any parameter) ends with the uninterrupted run's weights, bit for bit."""
    import shutil

    from families import build_model
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(demo_dir / "model").vocab_size
    folder = tmp_path / "mixtral"
    build_model("mixtral", vocab_size=vocab).save_pretrained(folder)
    for tokenizer_file in (demo_dir / "model").glob("*token*"):
        shutil.copy(tokenizer_file, folder)
    flags = {"model-name-or-path": folder, "max-steps": 2, "save-every-steps": 1,
             "activation-checkpointing": True}  # fmt: skip
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert train_in_process(*osft_flags(demo_dir, whole, **flags)).returncode == 0
    shutil.copytree(whole, resumed)
    for leftover in ("state/step_2", "final"):
        shutil.rmtree(resumed / leftover)
    result = train_in_process(*osft_flags(demo_dir, resumed, **flags, resume=True))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(step 1)" in result.stderr, result.stderr[-2000:]  # "resumed from ... (step 1)"
    want, got = final_weights(whole), final_weights(resumed)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
