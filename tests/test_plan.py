"""`mini-trainer plan`: counts from the meta model, the activation trace, the command's output
and its errors; and (slow) two configurations against a measured training run."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from helpers import REPO_ROOT, run_cli

from mini_trainer.errors import UserError
from mini_trainer.osft.svd import part_shapes
from mini_trainer.plan import activations
from mini_trainer.plan import model as planned
from mini_trainer.plan.inputs import Cluster, load_config, make_plan, training_args
from mini_trainer.plan.render import table

FIXTURES = Path(__file__).parent / "fixtures" / "plan"
LLAMA_8B = FIXTURES / "llama-3.1-8b"
LLAMA_70B = FIXTURES / "llama-3.1-70b"
MIXTRAL = FIXTURES / "mixtral-8x7b"


def meta(model_dir: Path, *flags: str, world: int = 1):
    args = training_args(model_dir, list(flags))
    wrapped, method = planned.build(load_config(model_dir, "cuda"), args)
    return wrapped, method, planned.count(wrapped, method, world, 0.0)


def test_shard_elements_pads_dim_zero_like_fully_shard():
    assert planned.shard_elements(torch.empty(10, 3, device="meta"), 4) == 3 * 3
    assert planned.shard_elements(torch.empty(8, 3, device="meta"), 4) == 2 * 3
    assert planned.shard_elements(torch.empty(5, device="meta"), 8) == 1


def test_llama_8b_counts_match_the_published_size():
    _, _, counts = meta(LLAMA_8B, world=8)
    assert counts.total_params == 8_030_261_248  # Llama 3.1 8B
    assert len(counts.units) == 33  # 32 decoder blocks and the root
    assert counts.root.params == 2 * 128256 * 4096 + 4096
    expected_shard = sum(planned.shard_elements(p, 8) for p in meta(LLAMA_8B)[0].parameters())
    assert counts.shard_params == expected_shard
    assert counts.decay_groups["no_decay"] == 65 * 4096  # the norms only


def test_mixtral_counts_its_total_and_active_parameters_as_published():
    _, _, counts = meta(MIXTRAL, world=8)
    assert counts.total_params == 46_702_792_704  # Mixtral 8x7B: "46.7B total"
    assert counts.expert_params == 32 * 8 * 3 * 4096 * 14336
    assert counts.active_params == 12_879_925_248  # "12.9B active" (2 of 8 experts)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plan_answers_for_every_family(device, tmp_path):
    """Every supported family's tiny model: a plan, no traceback; the active parameters of a
    mixture of experts are fewer than its total, a dense model's are its total."""
    from families import FAMILIES, build_model

    for family in FAMILIES:
        folder = tmp_path / family.name
        build_model(family.name).config.save_pretrained(folder)
        cluster = Cluster(1, 2, 80.0, device)
        plan = make_plan(str(folder), None, cluster, ["--max-tokens-per-gpu", "64"])
        params = plan["parameters"]
        moe = family.name in ("gpt_oss", "mixtral", "qwen3_moe", "deepseek_v3", "granitemoe")
        assert (params["active"] < params["total"]) == moe, family.name
        assert plan["per_gpu"]["peak_bytes"] > 0


def test_osft_counts_follow_the_ranks_the_method_keeps(demo_model):
    wrapped, method, counts = meta(demo_model, "--osft", "--osft-unfreeze-rank-ratio", "0.25")
    assert counts.osft_targets == 7 * 4
    trainable_factors = 0
    for target in method.targets.values():
        shapes = part_shapes(target.rows, target.cols, target.frozen)
        trainable_factors += sum(math.prod(shapes[n]) for n in ("U_low", "S_low", "V_low"))
    non_targets = sum(
        p.numel()
        for n, p in wrapped.named_parameters()
        if not n.rsplit(".", 1)[-1].endswith(
            ("W_high", "_high", "_low_init", "U_low", "S_low", "V_low")
        )
    )
    assert counts.trainable_params == trainable_factors + non_targets
    assert counts.shard_osft_trainable == trainable_factors
    assert counts.dense_params == meta(demo_model)[2].total_params


def test_activation_trace_is_linear_in_tokens_and_checkpointing_keeps_layer_inputs(demo_model):
    wrapped, _, _ = meta(demo_model)
    small = activations.trace(wrapped, 256, torch.bfloat16, cuda=True)
    large = activations.trace(wrapped, 512, torch.bfloat16, cuda=True)
    assert large.saved(False) == 2 * small.saved(False)
    hidden = 128
    assert small.layer_input_bytes == 256 * hidden * 2  # bf16 hidden state
    assert small.saved(True) < small.saved(False) / 4
    assert next(wrapped.parameters()).dtype == torch.float32  # restored after the trace


def test_plan_json_for_llama_8b_on_8_h100():
    result = run_cli(
        "plan",
        "--model",
        LLAMA_8B,
        "--gpus-per-node",
        "8",
        "--gpu-memory-gib",
        "80",
        "--gpu",
        "H100",
        "--max-tokens-per-gpu",
        "16384",
        "--activation-checkpointing",
        "--json",
        check=True,
    )
    plan = json.loads(result.stdout)
    gpu = plan["per_gpu"]
    assert gpu["fits"] and gpu["peak_bytes"] < gpu["budget_bytes"]
    assert gpu["largest_max_tokens_per_gpu"] > 16384
    sources = {line["name"]: line["source"] for line in gpu["lines"]}
    assert sources["activations of one packed row"] == "traced"
    assert sources["parameter shard (fp32)"] == "counted"
    assert plan["step_time_estimate"]["label"].startswith("estimate")


def test_plan_table_says_when_70b_does_not_fit_and_the_largest_t():
    cluster = Cluster(nodes=4, gpus_per_node=8, gpu_memory_gib=80, device="cuda")
    plan = make_plan(str(LLAMA_70B), None, cluster, ["--max-tokens-per-gpu", "16384"])
    gpu = plan["per_gpu"]
    assert not gpu["fits"] and gpu["margin_bytes"] < 0
    assert gpu["largest_max_tokens_per_gpu"] < 16384
    smaller = make_plan(
        str(LLAMA_70B),
        None,
        cluster,
        ["--max-tokens-per-gpu", str(gpu["largest_max_tokens_per_gpu"])],
    )
    assert smaller["per_gpu"]["fits"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-tokens-per-gpu", "0"], "--max-tokens-per-gpu: must be at least 1"),
        (["--max-tokens-per-gpu", "512", "--batch-size", "4"], "--batch-size: 4 samples"),
        (["--max-tokens-per-gpu", "512", "--gpu", "Z9000"], "--gpu: unknown GPU name"),
        (["--gpu-memory-gib", "nan"], "--gpu-memory-gib: 'nan' is not a finite number above 0"),
        (["--gpu-memory-gib", "inf"], "--gpu-memory-gib: 'inf' is not a finite number above 0"),
        (["--peak-tflops", "-inf"], "--peak-tflops: '-inf' is not a finite number above 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(flags, message):
    result = run_cli(
        "plan", "--model", LLAMA_8B, "--gpus-per-node", "8", "--gpu-memory-gib", "80", *flags
    )
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unknown_model_family_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-family"}))
    result = run_cli(
        "plan",
        "--model",
        tmp_path,
        "--gpus-per-node",
        "1",
        "--gpu-memory-gib",
        "80",
        "--max-tokens-per-gpu",
        "512",
    )
    assert result.returncode == 2
    assert "unknown model family 'no-such-family'" in result.stderr
    with pytest.raises(UserError):
        load_config(tmp_path, "cuda")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([1, 2], "not a model config (a JSON object), a list"),
        ({"hidden_size": 64}, "model_type: missing (which model family is it?)"),
        ({"model_type": ["llama"]}, "model_type: unknown model family ['llama']"),
    ],
)
def test_config_that_is_not_a_model_config_is_one_line(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError) as caught:
        load_config(tmp_path, "cuda")
    assert caught.value.lines == [f"{tmp_path / 'config.json'}: {message}"]


def _benchmark():
    spec = importlib.util.spec_from_file_location("plan_bench", REPO_ROOT / "benchmarks/plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", ["demo-1r-T512", "demo-2r-T256-ac-osft"])
def test_plan_peak_within_15_percent_of_a_measured_run(name, demo_dir, tmp_path):
    bench = _benchmark()
    kind, ranks, tokens, ac, osft = bench.CONFIGS[name]
    model = demo_dir / "model"
    data = bench.make_data(
        tmp_path, json.loads((model / "config.json").read_text())["vocab_size"], 64
    )
    flags = bench.training_flags(model, ranks, tokens, ac, osft)
    measured = bench.measure(model, data, flags, ranks, tmp_path, name)
    predicted = bench.predict(model, ranks, flags)
    assert abs(predicted["peak"] / measured["peak"] - 1) <= 0.15, (predicted, measured)


def test_resident_high_water_mark_sees_a_temporary_come_and_go():
    """The probe's measure of torchao's compiled step (which its tracker cannot see): a 64 MiB
    tensor made and freed between the reset and the read counts once, whole."""
    import torch

    from mini_trainer.training.memory_probe import _resident_peak, _resident_reset

    size = 64 * 2**20
    before = _resident_reset()
    temporary = torch.ones(size // 4)  # glibc maps it on its own (over its 32 MiB cap)
    del temporary
    extra = _resident_peak() - before
    assert 0.98 * size <= extra <= 1.15 * size, extra


def test_require_fit_prints_the_plan_then_exits_4():
    result = run_cli("plan", "--model", LLAMA_70B, "--nodes", "2", "--gpus-per-node", "8",
                     "--gpu-memory-gib", "80", "--max-tokens-per-gpu", "16384",
                     "--activation-checkpointing", "--require-fit")  # fmt: skip
    assert result.returncode == 4
    assert "DOES NOT FIT" in result.stdout
    assert "does not fit in 80.0 GiB" in result.stderr


def test_plan_reports_the_longest_sample_with_and_without_context_parallelism():
    """8B on 8 H100 with --context-parallel 8: the gathered keys and values are a line of
    their own (one layer with checkpointing: 8 x 16,384 tokens x 8 KV heads x 2 x 128 x bf16),
    and the longest sample with CP is longer than without, but less than 8 times (the buffer)."""
    cluster = Cluster(nodes=1, gpus_per_node=8, gpu_memory_gib=80, device="cuda")
    flags = ["--max-tokens-per-gpu", "16384", "--activation-checkpointing", "--batch-size", "1"]
    plan = make_plan(str(LLAMA_8B), None, cluster, [*flags, "--context-parallel", "8"])
    gpu = plan["per_gpu"]
    lines = {line["name"]: line["bytes"] for line in gpu["lines"]}
    assert lines["context parallel: gathered keys/values"] == 8 * 16384 * 8 * 2 * 128 * 2
    longest = gpu["longest_sample"]
    assert longest["context_parallel"] == 8 and plan["training"]["context_parallel"] == 8
    assert longest["without_cp"] < longest["with_cp"] < 8 * longest["without_cp"]
    assert longest["with_cp"] == 8 * gpu["largest_max_tokens_per_gpu"]  # one chunk per GPU
    assert "longest single sample that fits" in table(plan)


def test_the_staged_state_of_an_async_save_is_counted_where_training_would_hold_it():
    """A host line per node, weights and moments of each rank's shard: by default on a GPU
    node (whose host memory the plan does not know), with the rule in its note; never with
    --no-async-save; where the node's memory is known (--device cpu), by training's rule."""
    from mini_trainer.plan.host import staged_state_note

    cluster = Cluster(nodes=1, gpus_per_node=8, gpu_memory_gib=80, device="cuda")
    off = make_plan(str(LLAMA_8B), None, cluster, ["--max-tokens-per-gpu", "4096",
                                                   "--no-async-save"])  # fmt: skip
    default = make_plan(str(LLAMA_8B), None, cluster, ["--max-tokens-per-gpu", "4096"])
    lines = {line["name"]: line for line in default["per_node"]["host"]}
    (added,) = set(lines) - {line["name"] for line in off["per_node"]["host"]}
    # fp32 weights and two fp32 moments of 8.03B parameters, over the node's 8 GPUs together
    assert lines[added]["bytes"] == pytest.approx(8.03e9 * 12, rel=0.01)
    assert "the default: on where it fits in 50% of the node's available" in lines[added]["note"]
    assert staged_state_note(None, "adamw", 10, 20).startswith("default: the staged copy")
    assert staged_state_note(None, "adamw", 11, 20) is None  # more than half: training's off
    assert staged_state_note(True, "adamw", 11, 20) == "--async-save"
    assert staged_state_note(False, "adamw", 1, None) is None


def test_plan_config_prints_the_whole_experiments_peak_disk(tmp_path):
    """`plan --config`: the 8B example's sweep (2 methods x 2 rates x 3 stages), each method
    planned once; the peak is the sum of its lines, their counts from the DAG."""
    import yaml

    from mini_trainer.cli.training import experiment_lines_of
    from mini_trainer.plan.experiment import EVALUATION_BYTES, MethodDisk, experiment_lines

    config = yaml.safe_load((REPO_ROOT / "config/examples/llama-3.1-8b-8gpu.yaml").read_text())
    config["model"] = str(LLAMA_8B)  # its config.json: no Hub, no weights
    del config["model_revision"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    lines = {line["name"]: line for line in experiment_lines_of(str(path))}
    state = lines["sft: training states"]["bytes"] / 6  # 2 rates at once, 2 kept + 1 written
    assert state == pytest.approx(8.03e9 * 12, rel=0.01)  # fp32 weights and two moments
    assert lines["sft: final/ of 6 run(s)"]["bytes"] == pytest.approx(6 * 8.03e9 * 2, rel=0.01)
    assert lines["osft: SVD caches"]["note"].startswith("5 x ")  # base, then per rate and stage
    assert lines["evaluations"]["note"].startswith("39 JSON")  # (base + 12 runs) x 3 tasks
    peak = lines["peak disk of the experiment"]["bytes"]
    assert peak == sum(v["bytes"] for k, v in lines.items() if k != "peak disk of the experiment")
    # keep_states_after_final: every run's 2 states stay, and each running job writes one more
    sft = MethodDisk("sft", runs=6, chains=2, svd_caches=0, keep_states=2, state_bytes=10,
                     checkpoint_bytes=3, svd_bytes=0)  # fmt: skip
    keeping = {line["name"]: line["bytes"] for line in experiment_lines([sft], True, True, 1)}
    assert keeping["sft: training states"] == (6 * 2 + 2) * 10
    assert keeping["sft: final/ and best/ of 6 run(s)"] == 12 * 3
    assert keeping["peak disk of the experiment"] == 140 + 36 + EVALUATION_BYTES
    refused = run_cli("plan", "--config", path, "--gpus-per-node", "8")
    assert refused.returncode == 2
    assert "--config: takes the model, GPUs and training flags" in refused.stderr


def test_plan_config_counts_data_logs_and_exports_by_hand(tmp_path, monkeypatch):
    """`plan --config` on a tiny config (2 stages, a validation split, replay, an export at each
    epoch's end): the data files the DAG writes, estimated from the task files before any rule
    ran, the exports and the logs, each against the hand count; then measured once written."""
    import yaml
    from families import build_model

    from mini_trainer.cli.training import experiment_lines_of
    from mini_trainer.plan.experiment import LOG_BYTES, METRICS_ROW_BYTES

    monkeypatch.chdir(tmp_path)  # the pipeline's paths are relative to the folder it runs in
    build_model("llama").config.save_pretrained(tmp_path / "model")
    for task, lines, width in (("a", 10, 20), ("b", 8, 30)):  # every line `width` bytes
        for split in ("train", "eval"):
            Path(f"{task}.{split}.jsonl").write_text(("x" * (width - 1) + "\n") * lines)
    config = {
        "model": "model", "stages": ["a", "b"],
        "tasks": {t: {"train": f"{t}.train.jsonl", "eval": f"{t}.eval.jsonl"} for t in "ab"},
        "data": {"validation_fraction": 0.25},
        "launch": {"nproc_per_node": 1, "gpus_per_node": 0},
        "training": {"batch_size": 4, "max_tokens_per_gpu": 64, "training_mode": "epoch",
                     "max_epochs": 2, "checkpoint_at_epoch": True},
        "methods": {"replay": {"learning_rates": [0.01], "replay_fraction": 0.5}},
    }  # fmt: skip
    Path("config.yaml").write_text(yaml.safe_dump(config))
    lines = {line["name"]: line for line in experiment_lines_of("config.yaml")}
    # validation splits: a keeps 10 - ceil(2.5) = 7 lines to train on, b 8 - 2 = 6; stage 2
    # trains on b's 6 and round(0.5 x 7) = 4 of a's (replay): 10 samples
    a, b = 20, 30
    data = (7 * a + 3 * a) + (6 * b + 2 * b) + (6 * b + 4 * a)  # both splits, the mixture
    assert lines["data (results/data)"]["bytes"] == data == 700
    assert lines["data (results/data)"]["note"].startswith("5 file(s)")
    # 7 samples in batches of 4: 2 steps an epoch, 4 in all; 10 samples: 3, 6 in all; an
    # export at each of the 2 epochs' ends of both runs
    checkpoint = lines["replay: final/ and best/ of 2 run(s)"]["bytes"] // 4
    assert lines["replay: hf_format/ exports"]["bytes"] == 4 * checkpoint
    jobs = 2 + 3 + 5 + 2  # runs, evaluations (base, 2 runs), data files, validated train files
    assert lines["logs and metrics"]["bytes"] == jobs * LOG_BYTES + (4 + 6) * METRICS_ROW_BYTES
    peak = lines["peak disk of the experiment"]["bytes"]
    assert peak == sum(v["bytes"] for k, v in lines.items() if k != "peak disk of the experiment")
    # once written, a file counts as it is on disk
    Path("results/data").mkdir(parents=True)
    Path("results/data/a.split.validation.jsonl").write_text("y" * 1000)
    measured = {line["name"]: line for line in experiment_lines_of("config.yaml")}
    assert measured["data (results/data)"]["bytes"] == data - 3 * a + 1000
