"""From the command's flags to the plan: the cluster, the training flags, the model's config.

Training flags are parsed by `training_args.parse_training_args`, so they have the names,
defaults and checks of `train`; the plan fills the flags it does not need (data, output folder).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mini_trainer.errors import UserError
from mini_trainer.models.hub import resolve_model
from mini_trainer.optimizer_options import bf16_compute
from mini_trainer.training_args import TrainingArgs, parse_training_args

DEFAULT_BANDWIDTH_GBS = {"intra": 360.0, "inter": 45.0}
"""Per-GPU collective bandwidth assumed (GB/s): NVLink-class inside a node, one 400 Gb/s NIC
per GPU across nodes. Override with --bandwidth-gbs."""


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float
    device: str
    """cuda (the default) or cpu (fp32, the CPU attention path: what the CPU tests run)."""
    gpu_name: str | None = None
    peak_tflops: float | None = None
    bandwidth_gbs: float | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def resolve_model_dir(model: str, revision: str | None) -> Path:
    """The local folder holding `config.json`: a local folder, or a Hub id resolved (config and
    tokenizer files only, never weights) into the Hugging Face cache."""
    path = resolve_model(model, revision, weights=False, flag="--model").folder
    if not (path / "config.json").is_file():
        raise UserError(f"{model}: --model: no config.json in this folder")
    return path


def training_args(model_dir: Path, flags: list[str]) -> TrainingArgs:
    """The training flags as `train` parses them, with placeholders for what a plan ignores."""
    given = {flag.split("=", 1)[0] for flag in flags}
    extra = ["--model-name-or-path", str(model_dir)]
    for flag in ("--data-path", "--output-dir"):
        if flag not in given:
            extra += [flag, "(plan)"]
    return parse_training_args([*extra, *flags])


def load_config(model_dir: Path, device: str):
    """The model's config as training loads it, or one line for an unknown family."""
    # deferred: transformers, torch: plan reports a bad flag or folder before loading them
    from transformers import CONFIG_MAPPING

    from mini_trainer.training import model_setup, packed_attention

    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a model config (a JSON object), a {type(config).__name__}")
    family = config.get("model_type")
    if family is None:
        raise UserError(f"{path}: model_type: missing (which model family is it?)")
    if not isinstance(family, str) or family not in CONFIG_MAPPING:
        raise UserError(f"{path}: model_type: unknown model family {family!r}")
    # the implementation every family accepts; the trace swaps in its own stand-ins
    return model_setup.load_config(str(model_dir), packed_attention.register())


def make_plan(model: str, revision: str | None, cluster: Cluster, flags: list[str]) -> dict:
    """The whole plan as one JSON-able object (`render.py` prints it)."""
    # deferred: torch, once the flags and the model folder are checked
    import torch

    from mini_trainer.plan import activations, host, memory, optimizer_state
    from mini_trainer.plan import model as planned
    from mini_trainer.training.loss import DEFAULT_CHUNK_SIZE

    started = time.perf_counter()
    model_dir = resolve_model_dir(model, revision)
    args = training_args(model_dir, flags)
    if cluster.world % args.context_parallel:
        raise UserError(
            f"--context-parallel: {args.context_parallel} does not divide the {cluster.world} GPUs"
        )
    groups = cluster.world // args.context_parallel
    if args.batch_size < groups:
        raise UserError(
            f"--batch-size: {args.batch_size} samples cannot give each of the "
            f"{groups} GPU groups one ({cluster.nodes} x {cluster.gpus_per_node} GPUs, "
            f"--context-parallel {args.context_parallel})"
        )
    cuda = cluster.device == "cuda"
    if args.cpu_offload and not cuda:
        raise UserError("--cpu-offload: needs --device cuda")
    config = load_config(model_dir, cluster.device)
    wrapped, method = planned.build(config, args)
    counts = planned.count(wrapped, method, cluster.world, args.weight_decay)
    compute = torch.bfloat16 if bf16_compute(cuda) else torch.float32
    trace = activations.trace(wrapped, args.max_tokens_per_gpu, compute, cuda)
    setup = memory.Setup(
        world=cluster.world,
        tokens=args.max_tokens_per_gpu,
        cuda=cuda,
        activation_checkpointing=args.activation_checkpointing,
        cpu_offload=args.cpu_offload,
        liger=args.use_liger_kernels,
        defer_grad_sync=args.defer_grad_sync,
        chunk_size=DEFAULT_CHUNK_SIZE,
        hidden=config.hidden_size,
        vocab=config.vocab_size,
        param_bytes=optimizer_state.PARAM_BYTES[args.param_dtype],
        optimizer_state_bytes=optimizer_state.state_bytes(wrapped, args, cluster.world),
        optimizer=args.optimizer,
        step_copies=optimizer_state.step_copies(args),
        context_parallel=args.context_parallel,
        kv_bytes_per_token=kv_bytes_per_token(config, compute),
    )
    result = memory.memory(counts, trace, setup)
    budget = int(cluster.gpu_memory_gib * memory.GIB)
    # with CP: the run's N, else one node's GPUs as the group a long sample would use
    cp = args.context_parallel if args.context_parallel > 1 else cluster.gpus_per_node
    without_cp = replace(setup, context_parallel=1)
    host_lines, disk_lines = host.host_and_disk(
        counts,
        cluster.gpus_per_node,
        args.cpu_offload,
        args.osft,
        {"float32": 4, "bfloat16": 2, "float16": 2}[args.save_dtype],
        param_bytes=setup.param_bytes,
        state_bytes=setup.optimizer_state_bytes,
        saved_states=None
        if args.optimizer == "adamw"
        else setup.optimizer_state_bytes * cluster.world,
        async_save=args.async_save,
        optimizer=args.optimizer,
        # --device cpu: --gpu-memory-gib is each rank's share of the host's memory; what its
        # peak leaves is what the staged copy may use (unknown on a GPU node)
        host_available=None if cuda else cluster.gpus_per_node * max(budget - result.peak, 0),
    )
    return {
        "model": str(model_dir),
        "model_type": config.model_type,
        "cluster": asdict(cluster) | {"world_size": cluster.world},
        "training": {
            "max_tokens_per_gpu": args.max_tokens_per_gpu,
            "context_parallel": args.context_parallel,
            "batch_size": args.batch_size,
            "method": args.method,
            "osft": args.osft,
            "osft_unfreeze_rank_ratio": args.osft_unfreeze_rank_ratio,
            **args.method_group().plan_terms(args),
            "activation_checkpointing": args.activation_checkpointing,
            "cpu_offload": args.cpu_offload,
            "use_liger_kernels": args.use_liger_kernels,
            "defer_grad_sync": args.defer_grad_sync,
            "optimizer": args.optimizer,
            "param_dtype": args.param_dtype,
        },
        "parameters": {
            "total": counts.total_params,
            "trainable": counts.trainable_params,
            "expert": counts.expert_params,
            "active": counts.active_params,
            "per_gpu_shard": counts.shard_params,
            "fsdp_units": len(counts.units),
            "optimizer_groups": counts.decay_groups,
            "osft_targets": counts.osft_targets,
        },
        "per_gpu": {
            "lines": [asdict(line) for line in result.lines],
            "phases": result.phases,
            "peak_phase": result.peak_phase,
            "peak_bytes": result.peak,
            "budget_bytes": budget,
            "fits": result.peak <= budget,
            "margin_bytes": budget - result.peak,
            "largest_max_tokens_per_gpu": memory.largest_tokens(counts, trace, setup, budget),
            "longest_sample": {
                "without_cp": memory.longest_sample(counts, trace, without_cp, budget),
                "with_cp": memory.longest_sample(
                    counts, trace, replace(setup, context_parallel=cp), budget
                ),
                "context_parallel": cp,
            },
        },
        "per_node": {"host": host_lines, "disk": disk_lines},
        "step_time_estimate": step_time(wrapped, counts, cluster, setup),
        "plan_seconds": round(time.perf_counter() - started, 2),
    }


def kv_bytes_per_token(config, compute_dtype) -> int:
    """One layer's key and value bytes per token: KV heads x (key + value head size), in the
    compute dtype (MLA models: every head, qk and v head sizes apart)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    k_dim = getattr(config, "qk_head_dim", None) or head_dim
    if getattr(config, "qk_rope_head_dim", None) and getattr(config, "qk_nope_head_dim", None):
        k_dim = config.qk_rope_head_dim + config.qk_nope_head_dim
    v_dim = getattr(config, "v_head_dim", None) or head_dim
    return heads * (k_dim + v_dim) * compute_dtype.itemsize


def step_time(wrapped, counts, cluster: Cluster, setup) -> dict:
    """FLOPs and collective bytes of one micro-batch on one GPU, and the times they take at the
    stated peak and bandwidth: an estimate, never a measurement."""
    # deferred: torch (as in make_plan)
    from mini_trainer.training.flops import ModelFlops, peak_flops

    flops = ModelFlops.of(wrapped.model, None).step_flops(setup.tokens, setup.tokens**2)
    peak = cluster.peak_tflops * 1e12 if cluster.peak_tflops else peak_flops(cluster.gpu_name)
    inter = cluster.nodes > 1
    bandwidth = cluster.bandwidth_gbs or DEFAULT_BANDWIDTH_GBS["inter" if inter else "intra"]
    share = (cluster.world - 1) / cluster.world
    layers = sum(u.params for u in counts.layer_units)
    gathered = (2 * layers + counts.root.params) * setup.compute_bytes  # forward, backward, root
    reduced = counts.trainable_params * 4
    comm = int((gathered + reduced) * share)
    return {
        "label": "estimate (not a measurement)",
        "flops_per_micro_batch": flops,
        "assumes": "one sample of max_tokens_per_gpu tokens (attention's worst case)",
        "peak_tflops": peak / 1e12 if peak else None,
        "compute_seconds_at_peak": flops / peak if peak else None,
        "collective_bytes_per_micro_batch": comm,
        "bandwidth_gbs": bandwidth,
        "collective_seconds": comm / (bandwidth * 1e9),
    }
