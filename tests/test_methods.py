"""Methods by name (`--method`, the registry in mini_trainer/methods/), EWC and interpolation.

EWC's numbers are checked against computations that share nothing with the code under test:
the Fisher against Hugging Face's own label loss, the penalty's value and gradient against
autograd of `lambda/2 sum F (theta - theta*)^2` over tensors read by the safetensors library.
"""

from __future__ import annotations

import json
import subprocess

import helpers
import pytest
import torch
from helpers import base_flags, read_metrics, run_cli, train_in_process
from safetensors.torch import load_file, save_file

from mini_trainer.errors import UserError
from mini_trainer.ewc.fisher import build_fisher, open_fisher
from mini_trainer.ewc.method import EWC
from mini_trainer.method import MethodContext, TrainingMethod
from mini_trainer.methods import METHODS, REGISTERED
from mini_trainer.models.interpolate import interpolate
from mini_trainer.training.fingerprint import options_fingerprint
from mini_trainer.training.method import make_method, method_class
from mini_trainer.training_args import TrainingArgs, parse_training_args

REQUIRED = ["--model-name-or-path", "m", "--data-path", "d", "--output-dir", "o"]


def args_of(*flags: str) -> TrainingArgs:
    return parse_training_args([*REQUIRED, *flags])


# ---------------------------------------------------------------------------- by name


def test_osft_flag_is_method_osft_and_a_conflict_is_one_line():
    by_flag = args_of("--osft", "--osft-unfreeze-rank-ratio", "0.5")
    by_name = args_of("--method", "osft", "--osft-unfreeze-rank-ratio", "0.5")
    assert by_flag == by_name and by_flag.method == "osft" and by_name.osft is True
    assert args_of().method == "sft" and args_of().osft is False
    conflict = "^--osft: is --method osft, and this run asks for --method ewc"
    with pytest.raises(UserError, match=conflict):
        args_of("--osft", "--method", "ewc")
    with pytest.raises(UserError, match=r"--method: unknown value 'lora' \(one of sft, osft, ewc"):
        args_of("--method", "lora")


def test_an_option_belongs_to_its_method():
    with pytest.raises(UserError, match="^--ewc-lambda: needs --method ewc$"):
        args_of("--ewc-lambda", "2")
    with pytest.raises(UserError, match="^--osft-rank-mode: needs --osft$"):
        args_of("--method", "ewc", "--osft-rank-mode", "adaptive")
    with pytest.raises(UserError, match="--ewc-lambda: must be at least|--ewc-lambda: must be a"):
        args_of("--method", "ewc", "--ewc-lambda=-1")
    assert args_of("--method", "ewc", "--ewc-lambda", "3").ewc_lambda == 3.0


def test_every_registered_method_is_a_training_method_built_from_the_arguments(tmp_path):
    assert [group.name for group in REGISTERED] == list(METHODS)
    for name, group in METHODS.items():
        cls = method_class(name)
        assert isinstance(cls, type) and group.label and group.own_fields() is not None
        flags = {"osft": ["--osft-unfreeze-rank-ratio", "0.5"]}.get(name, [])
        method = make_method(args_of("--method", name, *flags))
        assert isinstance(method, TrainingMethod) and isinstance(method, cls)


def test_fingerprints_of_sft_and_osft_runs_keep_their_old_keys_and_ewc_names_its_fisher(tmp_path):
    sft = options_fingerprint(args_of())
    osft = options_fingerprint(args_of("--osft", "--osft-unfreeze-rank-ratio", "0.5"))
    for fingerprint in (sft, osft):  # what states saved before --method hold, and nothing new
        assert "method" not in fingerprint and "ewc_lambda" not in fingerprint
        assert {"osft", "osft_unfreeze_rank_ratio", "osft_rank_mode"} <= set(fingerprint)
    folder = tmp_path / "fisher"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"checksum": "abc123"}))
    ewc = options_fingerprint(args_of("--method", "ewc", "--ewc-fisher", str(folder)))
    assert ewc["method"] == "ewc" and ewc["ewc_lambda"] == 1.0 and ewc["ewc_fisher"] == "abc123"
    moved = tmp_path / "moved"
    folder.rename(moved)  # a moved folder is the same run; its content decides
    assert options_fingerprint(args_of("--method", "ewc", "--ewc-fisher", str(moved))) == ewc
    with pytest.raises(UserError, match="--ewc-fisher: .*not an ewc-fisher record"):
        options_fingerprint(args_of("--method", "ewc", "--ewc-fisher", str(folder)))


# ---------------------------------------------------------------------------- EWC


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama folder and four samples with loss tokens."""
    root = tmp_path_factory.mktemp("ewc")
    model = helpers.tiny_llama(seed=3, vocab_size=32)
    model.save_pretrained(root / "model")
    generator = torch.Generator().manual_seed(0)
    lines = []
    for length in (7, 9, 5, 8):
        ids = torch.randint(0, 32, (length,), generator=generator).tolist()
        labels = [-100] * 3 + ids[3:]
        lines.append(json.dumps({"input_ids": ids, "labels": labels}))
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    return root


def hf_sample_grads(model_dir, data):
    """Per-sample gradients of Hugging Face's own mean label loss (its shift, its masking)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    grads = []
    for line in data.read_text().splitlines():
        sample = json.loads(line)
        model.zero_grad()
        ids = torch.tensor([sample["input_ids"]])
        labels = torch.tensor([sample["labels"]])
        model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    return grads


def test_fisher_is_the_mean_squared_minibatch_gradient_accumulated_online(tiny, tmp_path):
    first = build_fisher(tiny / "model", tiny / "data.jsonl", tmp_path / "f1", batch_size=1)
    grads = hf_sample_grads(tiny / "model", tiny / "data.jsonl")
    fisher = load_file(tmp_path / "f1" / "fisher.safetensors")
    anchor = load_file(tmp_path / "f1" / "anchor.safetensors")
    weights = load_file(tiny / "model" / "model.safetensors")
    assert first["batches"] == 4 and first["stages"] == 1
    for name, value in fisher.items():
        expected = sum(g[name] ** 2 for g in grads) / len(grads)
        torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-10)
        assert torch.equal(anchor[name], weights[name])
    second = build_fisher(
        tiny / "model", tiny / "data.jsonl", tmp_path / "f2", previous=tmp_path / "f1",
        gamma=0.5, batch_size=2,
    )  # fmt: skip
    assert second["stages"] == 2 and second["batches"] == 2
    total = load_file(tmp_path / "f2" / "fisher.safetensors")
    lengths = [sum(x != -100 for x in json.loads(line)["labels"][1:])
               for line in (tiny / "data.jsonl").read_text().splitlines()]  # fmt: skip
    for name, value in total.items():
        batch_grads = []
        for a, b in ((0, 1), (2, 3)):  # a mini-batch's mean loss from the samples' means
            tokens = lengths[a] + lengths[b]
            batch_grads.append((grads[a][name] * lengths[a] + grads[b][name] * lengths[b]) / tokens)
        expected = 0.5 * fisher[name] + sum(g**2 for g in batch_grads) / 2
        torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-10)


def test_a_damaged_or_foreign_fisher_folder_is_refused(tiny, tmp_path):
    build_fisher(tiny / "model", tiny / "data.jsonl", tmp_path / "f", batch_size=2)
    other = helpers.tiny_llama(seed=4, vocab_size=32)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(UserError, match="taken at other weights than"):
        open_fisher(tmp_path / "f").check_model(tmp_path / "other")
    open_fisher(tmp_path / "f").check_model(tiny / "model")
    path = tmp_path / "f" / "fisher.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="fisher.safetensors: missing or not the file"):
        open_fisher(tmp_path / "f")


class Wrapped(torch.nn.Module):
    """The training model's shape: the Hugging Face model as `.model`."""

    def __init__(self, model):
        super().__init__()
        self.model = model


def test_ewc_penalty_and_its_gradient_match_autograd_of_the_formula(tiny, tmp_path):
    build_fisher(tiny / "model", tiny / "data.jsonl", tmp_path / "f", batch_size=2)
    from transformers import AutoModelForCausalLM

    model = Wrapped(AutoModelForCausalLM.from_pretrained(tiny / "model", dtype=torch.float32))
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.01)
            param.grad = torch.randn_like(param)
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    lam = 7.5
    args = parse_training_args([
        "--model-name-or-path", str(tiny / "model"), "--data-path", "d", "--output-dir", "o",
        "--method", "ewc", "--ewc-lambda", str(lam), "--ewc-fisher", str(tmp_path / "f"),
    ])  # fmt: skip
    method = EWC(args)
    method.adapt_model(model, MethodContext(None, tmp_path, None))
    method.before_optimizer_step(model)

    fisher = load_file(tmp_path / "f" / "fisher.safetensors")
    anchor = load_file(tmp_path / "f" / "anchor.safetensors")
    params = {
        n.removeprefix("model."): p.detach().clone().requires_grad_()
        for n, p in model.named_parameters()
    }
    penalty = lam / 2 * sum((fisher[n] * (p - anchor[n]) ** 2).sum() for n, p in params.items())
    penalty.backward()
    assert penalty.item() > 0
    assert method.step_metrics()["ewc_penalty"] == pytest.approx(penalty.item(), rel=1e-6)
    for name, param in model.named_parameters():
        expected = before[name] + params[name.removeprefix("model.")].grad
        torch.testing.assert_close(param.grad, expected, rtol=1e-6, atol=1e-9)


def test_lwf_kl_is_the_full_logits_formula_in_value_and_gradient():
    """Chunked, checkpointed KL(teacher_T || student_T) over the loss rows against the formula
    on whole logits (fp64), with the head's bias, scale and soft-cap; all tokens kept (exact),
    then the teacher's top 3: the KL of both distributions coarsened to those 3 tokens and one
    bucket for the rest, never negative even where the student holds more of the top 3."""
    from mini_trainer.training.lwf import distillation_kl, teacher_top_k

    gen = torch.Generator().manual_seed(0)
    n, h, v, temperature = 11, 8, 13, 2.0
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(v, generator=gen, dtype=torch.float64)
    t_hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    t_weight = torch.randn(v, h, generator=gen, dtype=torch.float64)
    rows = torch.tensor([0, 2, 3, 5, 6, 7, 10])
    head = {"bias": bias, "logit_scale": 0.5, "softcap": 3.0}

    def logits_of(x, w):
        return 3.0 * torch.tanh((x @ w.T + bias) * 0.5 / 3.0)

    for k in (v, 3):
        top = teacher_top_k(t_hidden, t_weight, rows, temperature, k, chunk_size=2, **head)
        got = distillation_kl(hidden, weight, rows, top, temperature, chunk_size=3, **head)
        got_grads = torch.autograd.grad(got, (hidden, weight))
        log_p = torch.log_softmax(logits_of(t_hidden[rows], t_weight) / temperature, dim=1)
        log_q = torch.log_softmax(logits_of(hidden[rows], weight) / temperature, dim=1)
        kept = torch.zeros_like(log_p, dtype=torch.bool)
        kept.scatter_(1, log_p.topk(k, dim=1).indices, True)
        p, q = log_p.exp(), log_q.exp()
        terms = p * (log_p - log_q)
        expected = torch.where(kept, terms, torch.zeros_like(terms)).sum()
        if k < v:  # the bucket of the other tokens, from the whole distributions
            p_rest = torch.where(kept, torch.zeros_like(p), p).sum(dim=1)
            q_rest = torch.where(kept, torch.zeros_like(q), q).sum(dim=1)
            expected = expected + (p_rest * (p_rest.log() - q_rest.log())).sum()
        expected_grads = torch.autograd.grad(expected, (hidden, weight))
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
        for a, b in zip(got_grads, expected_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert got > 1e-3  # a real term, not an empty sum
    # A student holding more of the teacher's top 3 than the teacher: the 3 terms alone sum
    # below 0; with the rest's bucket the KL stays positive.
    sharp = teacher_top_k(t_hidden, t_weight, rows, temperature, 3, **head)
    log_q = sharp.log_probs.new_full((rows.numel(), v), -30.0)
    log_q.scatter_(1, sharp.indices, 0.0)
    student = torch.log_softmax(log_q, dim=1)
    partial = (sharp.log_probs.exp() * (sharp.log_probs - student.gather(1, sharp.indices))).sum()
    assert partial < 0
    one_hot_head = torch.eye(v, dtype=torch.float64)
    kl = distillation_kl(student * temperature, one_hot_head, torch.arange(rows.numel()), sharp,
                         temperature)  # fmt: skip
    assert kl > 0


def ewc_flags(demo_dir, out, **extra):
    return base_flags(
        demo_dir, out, task="sort_desc", **{"training-mode": "step", "max-steps": 3,
        "batch-size": 8, "save-final-checkpoint": True, **extra},
    )  # fmt: skip


@pytest.fixture(scope="module")
def demo_fisher(demo_dir, tmp_path_factory):
    """The demo model's Fisher on 16 samples of sort (the stage before sort_desc)."""
    out = tmp_path_factory.mktemp("demo_fisher") / "fisher"
    run_cli(
        "ewc-fisher", "--model", demo_dir / "model", "--data", demo_dir / "data/sort.train.jsonl",
        "--out", out, "--max-samples", "16", "--batch-size", "4", check=True,
    )  # fmt: skip
    return out


def test_ewc_lambda_0_and_lwf_weight_0_train_sft_bit_for_bit_and_positive_ones_do_not(
    demo_dir, demo_fisher, tmp_path
):
    runs = {
        "sft": {},
        "ewc0": {"method": "ewc", "ewc-lambda": 0.0, "ewc-fisher": demo_fisher},
        "ewc": {"method": "ewc", "ewc-lambda": 1e4, "ewc-fisher": demo_fisher},
        "lwf0": {"method": "lwf", "lwf-weight": 0.0},
        "lwf": {"method": "lwf", "lwf-weight": 1.0, "lwf-temperature": 2.0},
    }
    weights = {}
    for name, extra in runs.items():
        result = train_in_process(*ewc_flags(demo_dir, tmp_path / name, **extra))
        assert result.returncode == 0, result.stderr[-3000:]
        weights[name] = load_file(tmp_path / name / "final" / "model.safetensors")
    for same, other in (("ewc0", "ewc"), ("lwf0", "lwf")):
        assert all(torch.equal(weights["sft"][k], weights[same][k]) for k in weights["sft"])
        assert not all(torch.equal(weights["sft"][k], weights[other][k]) for k in weights["sft"])
    kl = [row["lwf_kl"] for row in read_metrics(tmp_path / "lwf")]
    assert abs(kl[0]) < 1e-6 and kl[-1] > 1e-4  # the teacher is the start: equal at step 1
    penalties = [row["ewc_penalty"] for row in read_metrics(tmp_path / "ewc")]
    assert penalties[0] == 0.0 and penalties[-1] > 0  # step 1 is at the anchor itself
    assert json.loads((tmp_path / "ewc" / "method.json").read_text())["method"] == "ewc"


@pytest.mark.slow
def test_ewc_and_lwf_on_two_ranks_log_their_terms_as_the_per_sample_reference(
    demo_dir, demo_fisher, tmp_path
):
    """One torchrun launch, two jobs in the same two processes (tests/method_ranks.py).
    EWC: the penalty and its gradient live on each rank's shard: the logged sum over ranks
    equals the formula over whole tensors, and the weights equal a one-rank run's.
    LwF: the logged KL of steps 2 and 3 (each step all 8 samples, split over the ranks) equals
    KL(teacher || student) at T from the whole logits of transformers' own model, one sample at
    a time (teacher: the start; student: the checkpoint after the step before)."""
    extra = {"method": "ewc", "ewc-lambda": 1e4, "ewc-fisher": demo_fisher,
             "min-samples-per-checkpoint": 8}  # fmt: skip
    data = tmp_path / "eight.jsonl"
    lines = (demo_dir / "data/sort_desc.train.jsonl").read_text().splitlines()[:8]
    data.write_text("".join(line + "\n" for line in lines))
    temperature = 2.0
    lwf = {"method": "lwf", "lwf-weight": 1.0, "lwf-temperature": temperature,
           "lwf-top-k": 100000, "data-path": data, "min-samples-per-checkpoint": 8}  # fmt: skip
    jobs = tmp_path / "jobs.json"
    jobs.write_text(json.dumps([ewc_flags(demo_dir, tmp_path / "two", **extra),
                                ewc_flags(demo_dir, tmp_path / "lwf", **lwf)]))  # fmt: skip
    command = [*helpers.torchrun_command(nproc=2)[:-2], str(helpers.REPO_ROOT / "tests" /
               "method_ranks.py"), str(jobs)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=helpers.REPO_ROOT,
                            env=helpers.subprocess_env(), timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert train_in_process(*ewc_flags(demo_dir, tmp_path / "one", **extra)).returncode == 0
    fisher = load_file(demo_fisher / "fisher.safetensors")
    anchor = load_file(demo_fisher / "anchor.safetensors")
    rows = read_metrics(tmp_path / "two")
    for step in (2, 3):  # the penalty of step k is at the weights after step k - 1
        saved = tmp_path / "two" / f"hf_format/samples_{8 * (step - 1)}"
        weights = load_file(saved / "model.safetensors")
        hand = (
            1e4
            / 2
            * sum(
                (fisher[n].double() * (weights[n].double() - anchor[n].double()) ** 2).sum().item()
                for n in fisher
            )
        )
        assert rows[step - 1]["ewc_penalty"] == pytest.approx(hand, rel=1e-5)
    one = load_file(tmp_path / "one" / "final" / "model.safetensors")
    two = load_file(tmp_path / "two" / "final" / "model.safetensors")
    for name in one:  # Adam's normalized steps (3e-3) magnify sum-order noise where a grad is ~0
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-4)

    from transformers import AutoModelForCausalLM

    samples = [json.loads(line) for line in lines]
    teacher = AutoModelForCausalLM.from_pretrained(demo_dir / "model").eval()
    kl_rows = read_metrics(tmp_path / "lwf")
    for step in (2, 3):
        saved = tmp_path / "lwf" / f"hf_format/samples_{8 * (step - 1)}"
        student = AutoModelForCausalLM.from_pretrained(saved).eval()
        total, tokens = 0.0, 0
        for sample in samples:  # logits[t] against labels[t + 1], as the training loss
            ids = torch.tensor([sample["input_ids"]])
            kept = torch.tensor(sample["labels"][1:]) != -100
            with torch.no_grad():
                p, q = (model(ids, use_cache=False).logits[0, :-1][kept].double() / temperature
                        for model in (teacher, student))  # fmt: skip
            log_p, log_q = p.log_softmax(-1), q.log_softmax(-1)
            total += (log_p.exp() * (log_p - log_q)).sum().item()
            tokens += int(kept.sum())
        assert kl_rows[step - 1]["lwf_kl"] == pytest.approx(total / tokens, rel=1e-3)
        assert total / tokens > 1e-5  # a real divergence, not two equal models


def test_the_plan_counts_ewc_fisher_and_anchor_and_the_lwf_teacher_shard():
    from mini_trainer.plan.inputs import Cluster, make_plan

    model = str(helpers.REPO_ROOT / "tests/fixtures/plan/llama-3.1-8b")
    cluster = Cluster(1, 8, 80.0, "cuda", None, None, None)
    plans = {
        m: make_plan(model, None, cluster, ["--max-tokens-per-gpu", "4096", "--method", m])
        for m in ("sft", "ewc")
    }
    lines = {m: {x["name"]: x["bytes"] for x in p["per_gpu"]["lines"]} for m, p in plans.items()}
    state = lines["ewc"].pop("method state (EWC: Fisher and anchor, fp32)")
    del lines["ewc"]["allocator overhead"], lines["sft"]["allocator overhead"]  # % of the rest
    assert state == 8 * plans["ewc"]["parameters"]["per_gpu_shard"] > 0  # every weight trains
    assert lines["ewc"] == lines["sft"] and plans["ewc"]["training"]["method"] == "ewc"
    phases = {m: p["per_gpu"]["phases"] for m, p in plans.items()}
    assert all(phases["ewc"][k] == phases["sft"][k] + state for k in phases["sft"])
    lwf = make_plan(model, None, cluster, ["--max-tokens-per-gpu", "4096", "--method", "lwf"])
    teacher = {x["name"]: x["bytes"] for x in lwf["per_gpu"]["lines"]}
    assert teacher["teacher parameter shard (bf16, LwF)"] == 2 * lwf["parameters"]["per_gpu_shard"]


# ---------------------------------------------------------------------------- interpolation


def test_interpolation_is_the_blend_and_alpha_1_is_the_new_weights_bit_for_bit(tmp_path):
    previous, new = tmp_path / "previous", tmp_path / "new"
    for folder, seed in ((previous, 1), (new, 2)):
        helpers.tiny_llama(seed=seed, vocab_size=32).save_pretrained(folder)
    old_w, new_w = load_file(previous / "model.safetensors"), load_file(new / "model.safetensors")
    for alpha in (1.0, 0.0, 0.3):
        out = tmp_path / f"alpha{alpha}"
        interpolate(previous, new, alpha, out)
        got = load_file(out / "model.safetensors")
        assert set(got) == set(new_w) and (out / "config.json").is_file()
        for name, value in got.items():
            if alpha == 1.0:
                assert torch.equal(value, new_w[name])
            elif alpha == 0.0:
                assert torch.equal(value, old_w[name])
            else:
                torch.testing.assert_close(value, 0.7 * old_w[name] + 0.3 * new_w[name])
    result = run_cli("interpolate", "--previous", previous, "--new", new, "--alpha", "0.3",
                     "--out", tmp_path / "alpha0.3")  # fmt: skip
    assert result.returncode == 2 and "exists (pass --force" in result.stderr
    save_file({"x": torch.zeros(2)}, tmp_path / "odd.safetensors")
    odd = tmp_path / "odd"
    odd.mkdir()
    (tmp_path / "odd.safetensors").rename(odd / "model.safetensors")
    with pytest.raises(UserError, match="not the same tensors"):
        interpolate(previous, odd, 0.5, tmp_path / "never")
    assert not (tmp_path / "never").exists()
    with pytest.raises(UserError, match="--alpha: must be in"):
        interpolate(previous, new, 1.5, tmp_path / "never")


# ---------------------------------------------------------------------------- the pipeline


def methods_config() -> dict:
    """config/methods.yaml as the Snakefile sees it: validated, defaults filled in, checked."""
    from snakemake.utils import validate

    from mini_trainer import pipeline

    config = pipeline.read_config_file(helpers.REPO_ROOT / "config/methods.yaml")
    validate(config, str(helpers.REPO_ROOT / "workflow/schemas/config.schema.yaml"))
    pipeline.check_config(config)
    return config


def test_the_methods_config_takes_each_ewc_stage_fisher_once_for_the_next_stage():
    """config/methods.yaml, as the Snakefile sees it (validated, defaults filled in): every
    method selected by name; EWC's stage i >= 2 reads the Fisher of stage i - 1, which the
    ewc_fisher rule takes from that stage's final weights and data, on top of the one before."""
    from mini_trainer import pipeline

    config = methods_config()
    assert {pipeline.method_options(config, m).get("method", "sft") for m in config["methods"]} == {
        "sft", "osft", "ewc", "lwf"
    }  # fmt: skip
    assert pipeline.training_options(config, "osft", "0.01", 1)["osft_svd_cache"]
    assert "ewc_fisher" not in pipeline.training_options(config, "ewc", "0.01", 1)
    runs = [pipeline.run_dir(config, "ewc", "0.01", stage) for stage in (1, 2, 3)]
    fishers = [pipeline.ewc_fisher_dir(run) for run in runs]
    assert fishers[0].startswith("results/ewc_fisher/ewc/lr0.01/stage1/")
    for stage in (2, 3):
        options = pipeline.training_options(config, "ewc", "0.01", stage)
        assert options["ewc_fisher"] == fishers[stage - 2]
        key = pipeline.run_key(config, "ewc", "0.01", stage)
        assert (
            pipeline.train_inputs(config, "ewc", "0.01", stage, key)["fisher"] == fishers[stage - 2]
        )
        TrainingArgs(**{**options, "output_dir": "out"})  # the job's flags are valid
    first = pipeline.ewc_fisher_inputs(config, runs[0].removeprefix("results/train/"))
    assert first == {"model": f"{runs[0]}/final", "data": "resources/demo/data/sort.train.jsonl"}
    second = pipeline.ewc_fisher_inputs(config, runs[1].removeprefix("results/train/"))
    assert second["previous"] == fishers[0] and second["model"] == f"{runs[1]}/final"
    assert second["data"] == "resources/demo/data/sort_desc.train.jsonl"
    settings = pipeline.ewc_fisher_settings(config, runs[1].removeprefix("results/train/"))
    assert settings == {"gamma": 1.0, "batch_size": 8, "max_samples": 256}
    with pytest.raises(pipeline.PipelineError, match="not the run folder"):
        pipeline.ewc_fisher_inputs(config, "ewc/lr0.01/stage1/0000000000")


def test_the_methods_config_interpolates_each_sft_run_and_scores_it_as_a_series():
    from mini_trainer import pipeline

    config = methods_config()
    sources = [s for s in pipeline.eval_sources(config) if s.startswith("sft-wise50/")]
    assert len(sources) == 2 * 3  # two learning rates, three stages
    runs = [pipeline.run_dir(config, "sft", "0.01", stage) for stage in (1, 2)]
    for stage, run in enumerate(runs, 1):
        source = f"sft-wise50/lr0.01/stage{stage}"
        folder = f"results/interpolate/{run.removeprefix('results/train/')}/wise50"
        assert pipeline.eval_model(config, source) == folder
        assert pipeline.eval_checkpoint(config, source) == folder
        assert pipeline.evaluated_source(config, source) == source
        inputs = pipeline.interpolation_inputs(config, run.removeprefix("results/train/"), "50")
        previous = "resources/demo/model" if stage == 1 else f"{runs[0]}/final"
        assert inputs == {"previous": previous, "new": f"{run}/final"}
    manifest = pipeline.manifest_flags(config)
    assert (
        "--eval results/eval/sft-wise50/lr0.01/stage2/sort.json sft-wise50 0.01 2 sort" in manifest
    )
    for alphas, problem in (([0.333], "not a multiple of 0.01"), ([0.5, 0.5], "same alpha twice")):
        bad = {**config, "methods": {**config["methods"]}}
        bad["methods"]["sft"] = {**config["methods"]["sft"], "interpolation_alphas": alphas}
        with pytest.raises(pipeline.ConfigError, match=problem):
            pipeline.check_config(bad)


def test_the_multitask_bound_is_one_run_from_the_base_model_on_every_stage_data():
    from mini_trainer import pipeline

    config = methods_config()
    runs = [(lr, s) for m, lr, s in pipeline.sweep(config) if m == "multitask"]
    assert runs == [("0.003", 3), ("0.01", 3)]  # only the last stage, per learning rate
    options = pipeline.training_options(config, "multitask", "0.01", 3)
    assert options["model_name_or_path"] == "resources/demo/model"
    assert options["data_path"] == "results/data/mix/sort_plus1-replay1.0.jsonl"
    assert pipeline.mix_inputs(config, "sort_plus1-replay1.0") == [
        ("resources/demo/data/sort_plus1.train.jsonl", "weight", "1.0"),
        ("resources/demo/data/sort.train.jsonl", "replay", "1.0"),
        ("resources/demo/data/sort_desc.train.jsonl", "replay", "1.0"),
    ]
    assert "multitask/lr0.01/stage3" in pipeline.eval_sources(config)
    assert "multitask/lr0.01/stage1" not in pipeline.eval_sources(config)
    bad = {**config, "methods": {**config["methods"]}}
    bad["methods"]["multitask"] = {**config["methods"]["multitask"], "replay_fraction": 0.5}
    with pytest.raises(pipeline.ConfigError, match="not with multitask"):
        pipeline.check_config(bad)


def test_the_manifest_describes_each_method_and_lists_its_jobs_benchmark_files(tmp_path):
    """config/methods.yaml's manifest flags: each series with its registered method's report
    label and its settings (the multi-task bound marked as such, an interpolated series as its
    alpha), and the benchmark file of every job done for a cell (training, the EWC Fisher of a
    stage a next one follows, each interpolation); `mini-trainer manifest` takes them as given."""
    import shlex

    from mini_trainer import pipeline
    from mini_trainer.manifest import load_manifest

    config = methods_config()
    infos = pipeline.method_infos(config)
    assert infos["lwf"] == {"label": "LwF", "method": "lwf", "bound": False,
                            "settings": {"lwf_weight": 1.0, "lwf_temperature": 2.0}}  # fmt: skip
    assert infos["replay"] == {"label": "SFT", "method": "sft", "bound": False,
                               "settings": {"replay_fraction": 0.25}}  # fmt: skip
    assert infos["multitask"]["bound"] and infos["multitask"]["settings"]["max_steps"] == 240
    assert [infos[m]["label"] for m in ("sft", "osft", "ewc")] == ["SFT", "OSFT", "EWC"]
    assert infos["sft-wise50"]["settings"] == {"interpolated_from": "sft", "alpha": 0.5}
    files = pipeline.benchmark_files(config)
    sweep = pipeline.sweep(config)
    assert sum(path.startswith("results/benchmarks/train/") for path, *_ in files) == len(sweep)
    fishers = [(m, lr, s) for path, m, lr, s in files if "/ewc_fisher/" in path]
    assert fishers == [("ewc", lr, s) for lr in ("0.003", "0.01") for s in ("1", "2")]
    assert sum("/interpolate/" in path for path, *_ in files) == 6  # 2 rates x 3 stages
    flags = shlex.split(pipeline.manifest_flags(config))
    run_cli("manifest", "--out", tmp_path / "m.json", *flags, check=True)
    manifest = load_manifest(tmp_path / "m.json")
    assert manifest.methods == infos
    assert sum(e.kind == "benchmark" for e in manifest.entries) == len(files)
