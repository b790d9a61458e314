"""The plan as a table for people (the JSON object is `inputs.make_plan`'s result as is)."""

from __future__ import annotations

GIB = 1024**3


def _gib(value: float) -> str:
    return f"{value / GIB:,.2f} GiB"


def _active(params: dict) -> str:
    """A mixture of experts' parameters per token, beside its total."""
    if not params.get("expert"):
        return ""
    return (
        f", {params['active'] / 1e9:.2f}B active per token "
        f"({params['expert'] / 1e9:.2f}B in routed experts)"
    )


def table(plan: dict) -> str:
    cluster, training, gpu = plan["cluster"], plan["training"], plan["per_gpu"]
    longest = gpu["longest_sample"]
    params = plan["parameters"]
    out = [
        f"plan: {plan['model']} ({plan['model_type']}, {params['total'] / 1e9:.2f}B parameters, "
        f"{params['trainable'] / 1e9:.2f}B trainable{_active(params)}, "
        f"{params['fsdp_units']} FSDP2 units)",
        f"cluster: {cluster['nodes']} x {cluster['gpus_per_node']} {cluster['device']} "
        f"(world {cluster['world_size']}), {cluster['gpu_memory_gib']:g} GiB each; "
        f"--max-tokens-per-gpu {training['max_tokens_per_gpu']}"
        + "".join(
            f", --{k.replace('_', '-')}"
            for k in (
                "osft",
                "activation_checkpointing",
                "cpu_offload",
                "use_liger_kernels",
                "defer_grad_sync",
            )
            if training[k]
        )
        + (
            f" {training['osft_unfreeze_rank_ratio']:g}"
            if training["osft"] and training["osft_unfreeze_rank_ratio"] is not None
            else ""
        ),
        "",
        f"per GPU {'':38s} {'bytes':>14s}  source   phases",
    ]
    short = {"forward end": "F", "backward start": "B", "backward end": "E", "optimizer step": "O"}
    for line in gpu["lines"]:
        phases = "".join(short[p] for p in line["phases"])
        note = f"  ({line['note']})" if line["note"] else ""
        out.append(
            f"  {line['name']:44s} {_gib(line['bytes']):>14s}  {line['source']:8s} {phases}{note}"
        )
    out.append(
        "  phases: F forward end, B backward start, E backward end, O optimizer step: "
        + ", ".join(f"{short[p]} {_gib(v)}" for p, v in gpu["phases"].items())
    )
    verdict = "fits" if gpu["fits"] else "DOES NOT FIT"
    out += [
        f"  peak {_gib(gpu['peak_bytes'])} at {gpu['peak_phase']} (allocator overhead included): "
        f"{verdict} in {_gib(gpu['budget_bytes'])}, margin {_gib(gpu['margin_bytes'])}",
        f"  largest --max-tokens-per-gpu that fits: {gpu['largest_max_tokens_per_gpu']:,}",
        f"  longest single sample that fits: {longest['without_cp']:,} tokens without context "
        f"parallelism, {longest['with_cp']:,} with --context-parallel "
        f"{longest['context_parallel']} (gathered keys/values counted)",
        "",
        "per node: host memory",
    ]
    for line in plan["per_node"]["host"]:
        out.append(f"  {line['name']:44s} {_gib(line['bytes']):>14s}  formula  ({line['note']})")
    out.append("disk")
    for line in plan["per_node"]["disk"]:
        out.append(f"  {line['name']:44s} {_gib(line['bytes']):>14s}  counted  ({line['note']})")
    step = plan["step_time_estimate"]
    compute = step["compute_seconds_at_peak"]
    out += [
        "",
        f"step time, {step['label']}: {step['flops_per_micro_batch'] / 1e12:,.1f} TFLOP per "
        f"micro-batch per GPU ({step['assumes']})"
        + (
            f" = {compute:.3f} s at {step['peak_tflops']:g} TFLOP/s peak"
            if compute
            else " (no peak known: pass --gpu or --peak-tflops)"
        ),
        f"  collectives: {step['collective_bytes_per_micro_batch'] / 1e9:,.2f} GB per micro-batch "
        f"per GPU = {step['collective_seconds']:.3f} s at {step['bandwidth_gbs']:g} GB/s",
        f"(planned in {plan['plan_seconds']:.1f} s; lines: counted from the meta model, traced on "
        "meta tensors, or formula: docs/plan.md)",
    ]
    return "\n".join(out)
