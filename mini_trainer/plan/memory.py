"""Per-GPU memory of a training step: the lines, the phases, the peak and the largest T.

Each line is bytes on one GPU (rank 0, the fullest: dim-0 padding lands on the first ranks) and
says where it comes from: `counted` (from the meta model's parameters and units), `traced` (the
meta-tensor trace of `activations.py`), or `formula` (a buffer whose size the code fixes but
that the plan cannot observe: the loss head's chunk, FSDP2's buffers, the allocator).

The peak is the largest of four moments of a step (steady state, from step 2 on):
- end of forward: shards, optimizer states, the root unit and the units in flight, every saved
  activation, the loss head's buffers (its forward computes the gradients too);
- start of backward: the same, plus the LM head's unsharded gradient, one unit's gradients in
  the reduce-scatter buffer, and the layer being recomputed with activation checkpointing;
- end of backward: the activations are gone, the layers' gradient shards are there, and the
  root's gradients, unsharded, with their reduce-scatter input (2+ ranks);
- optimizer step: shards, gradients, states, and the update's temporaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from mini_trainer.optimizer_options import bf16_compute
from mini_trainer.plan.activations import Trace
from mini_trainer.plan.model import Counts

GIB = 1024**3
ALLOCATOR_FRACTION = 0.05
"""CUDA caching-allocator fragmentation, as a share of tensor bytes (formula)."""
CUDA_CONTEXT_BYTES = int(1.5 * GIB)
"""CUDA context, cuBLAS workspaces and NCCL's own buffers, outside torch's tensors (formula)."""


@dataclass(frozen=True)
class Setup:
    """What the memory depends on besides the model."""

    world: int
    tokens: int
    cuda: bool
    activation_checkpointing: bool
    cpu_offload: bool
    liger: bool
    defer_grad_sync: bool
    chunk_size: int
    hidden: int
    vocab: int
    param_bytes: int = 4
    """Bytes per element of the master weights and gradients (`--param-dtype`)."""
    optimizer_state_bytes: int | None = None
    """Rank 0's optimizer state (plan/optimizer_state.py); None: fp32 AdamW's two moments."""
    optimizer: str = "adamw"
    step_copies: int = 0
    """fp32 copies of one parameter the lean step holds (lean_adamw.fp32_temporaries); 0: not
    a LeanAdamW mode."""
    context_parallel: int = 1
    """N of `--context-parallel`: `tokens` is then one rank's chunk of a row of N x tokens."""
    kv_bytes_per_token: int = 0
    """One layer's key and value bytes per token (all KV heads, compute dtype): what the
    context-parallel gather holds for every token of the row."""

    @property
    def compute_bytes(self) -> int:
        """bf16 compute on CUDA (MixedPrecisionPolicy), fp32 on the CPU (`bf16_compute`)."""
        return 2 if bf16_compute(self.cuda) else 4


@dataclass
class Line:
    name: str
    bytes: int
    source: str
    """counted, traced or formula."""
    phases: tuple[str, ...]
    note: str = ""


@dataclass
class Memory:
    lines: list[Line]
    phases: dict[str, int] = field(default_factory=dict)
    peak_phase: str = ""
    peak: int = 0


PHASES = ("forward end", "backward start", "backward end", "optimizer step")
FWD, BWD, BEND, OPT = PHASES


def loss_head_bytes(setup: Setup, tokens: int) -> tuple[int, int]:
    """(bytes held through the backward, bytes that live only inside the loss forward).

    training/loss.py: grad_hidden (N x H, compute dtype) and grad_weight (V x H, fp32 then cast
    to the weight's dtype) are kept for the backward; a chunk holds its logits in fp32 (the
    matmul's own output first when it computes in bf16) and the bf16 cast of their gradient.
    Liger's kernel is the same shape of work with its own chunk size (N / ceil(V / H) rounded
    up to a power of two)."""
    c_bytes = setup.compute_bytes
    chunk = min(setup.chunk_size, tokens)
    if setup.liger:
        chunk = 2 ** math.ceil(
            math.log2(max(1, math.ceil(tokens / math.ceil(setup.vocab / setup.hidden))))
        )
        chunk = min(chunk, tokens)
    held = tokens * setup.hidden * c_bytes + setup.vocab * setup.hidden * c_bytes
    per_chunk = chunk * setup.vocab * (4 + (2 * c_bytes if c_bytes != 4 else 0))
    if c_bytes != 4:  # the fp32 accumulator of grad_weight, cast to the weight's dtype at the end
        per_chunk += setup.vocab * setup.hidden * 4
    return held, per_chunk + chunk * setup.hidden * c_bytes


def memory(counts: Counts, trace: Trace, setup: Setup) -> Memory:
    """The per-GPU lines at `setup.tokens` tokens per row (the trace is linear in tokens)."""
    scale = setup.tokens / trace.tokens
    c_bytes = setup.compute_bytes
    on_gpu = 0 if setup.cpu_offload else 1
    plain = counts.shard_params - counts.shard_osft_frozen - counts.shard_osft_trainable
    largest_unit = max(u.params for u in counts.layer_units)
    largest_trainable_unit = max(u.trainable for u in counts.layer_units)
    saved = int(trace.saved(setup.activation_checkpointing) * scale)
    held, chunk = loss_head_bytes(setup, setup.tokens)
    recompute = int(trace.layer_bytes * scale) if setup.activation_checkpointing else 0
    p_bytes = setup.param_bytes
    p_name = "fp32" if p_bytes == 4 else "bf16"
    layer_grads = (counts.shard_trainable - counts.root.shard_trainable) * p_bytes
    states = setup.optimizer_state_bytes
    if states is None:
        states = 2 * counts.shard_trainable * 4
    root_grads = counts.root.trainable * (c_bytes + (4 if setup.world > 1 else 0))
    grads_unsharded = 0
    if setup.defer_grad_sync:  # every unit's gradients unsharded (fp32) between micro-batches
        grads_unsharded = counts.trainable_params * 4
    lines = [
        Line(
            f"parameter shard ({p_name})",
            plain * p_bytes * on_gpu,
            "counted",
            PHASES,
            "on the host (--cpu-offload)" if setup.cpu_offload else "",
        ),
        Line(
            "OSFT factors and bases (fp32)",
            (counts.shard_osft_frozen + counts.shard_osft_trainable) * 4 * on_gpu,
            "counted",
            PHASES,
            "W_high and frozen bases; low factors train",
        ),
        Line(
            f"gradient shard ({p_name})",
            counts.shard_trainable * p_bytes * on_gpu,
            "counted",
            (OPT,),
        ),
        Line(
            "gradient shard of the decoder layers",
            layer_grads * on_gpu,
            "counted",
            (BEND,),
            "all but the root's, which is reduced last",
        ),
        Line(
            f"optimizer states ({setup.optimizer})",
            states * on_gpu,
            "counted",
            PHASES,
            "the optimizer's own state layout on rank 0's shards",
        ),
        Line(
            "root unit unsharded",
            counts.root.params * c_bytes,
            "counted",
            (FWD, BWD, BEND),
            "embeddings, final norm, LM head: not resharded after forward",
        ),
        Line(
            "decoder units in flight",
            2 * largest_unit * c_bytes,
            "counted",
            (FWD, BWD, BEND),
            "the running unit and the prefetched one",
        ),
        Line(
            "activations of one packed row",
            saved,
            "traced",
            (FWD, BWD),
            f"{trace.traced_layers} of {trace.layers} layers traced on meta tensors",
        ),
        Line("recomputed layer (checkpointing)", recompute, "traced", (BWD,)),
        Line("loss head: gradients kept for backward", held, "formula", (FWD, BWD)),
        Line("loss head: one chunk's logits", chunk, "formula", (FWD,)),
        Line(
            "root gradients, unsharded",
            root_grads,
            "counted",
            (BEND,),
            "embeddings and LM head, with their fp32 reduce-scatter input",
        ),
        Line(
            "communication buffers",
            largest_unit * c_bytes + largest_trainable_unit * 4,
            "formula",
            (BWD, BEND),
            "one unit's all-gather output and reduce-scatter input",
        ),
        Line("unsharded gradients (--defer-grad-sync)", grads_unsharded, "counted", (BEND,)),
        gathered_kv(trace, setup),
        step_temporaries(counts, setup, on_gpu),
    ]
    if counts.method_state_bytes:  # a line only for a method that keeps state (EWC)
        lines.insert(2, Line(
            "method state (EWC: Fisher and anchor, fp32)",
            counts.method_state_bytes * on_gpu,
            "counted",
            PHASES,
            "8 bytes per trainable element of the shard",
        ))  # fmt: skip
    if counts.teacher_shard_params:  # LwF: the frozen teacher, sharded as the student
        lines.insert(2, Line(
            f"teacher parameter shard ({'bf16' if setup.cuda else 'fp32'}, LwF)",
            counts.teacher_shard_params * (2 if setup.cuda else 4) * on_gpu,
            "counted",
            PHASES,
            "frozen; its forward's activations (no gradients) are not counted",
        ))  # fmt: skip
    result = Memory([line for line in lines if line.bytes or line.source != "formula"])
    for phase in PHASES:
        result.phases[phase] = sum(line.bytes for line in result.lines if phase in line.phases)
    result.peak_phase = max(PHASES, key=lambda p: result.phases[p])
    tensors = result.phases[result.peak_phase]
    overhead = int(tensors * ALLOCATOR_FRACTION) + CUDA_CONTEXT_BYTES if setup.cuda else 0
    result.lines.append(
        Line(
            "allocator overhead",
            overhead,
            "formula",
            PHASES,
            f"{ALLOCATOR_FRACTION:.0%} of tensors + {CUDA_CONTEXT_BYTES / GIB:.1f} GiB CUDA/NCCL"
            if setup.cuda
            else "none counted on the CPU (tensor bytes only)",
        )
    )
    result.peak = tensors + overhead
    return result


def gathered_kv(trace: Trace, setup: Setup) -> Line:
    """Context parallelism's gathered keys and values (formula): the whole row's (N x tokens),
    kept for backward by every layer, or by the one layer running with activation
    checkpointing. The rank's own chunk is in the traced activations too (counted twice)."""
    n = setup.context_parallel
    layers = 1 if setup.activation_checkpointing else trace.layers
    size = layers * n * setup.tokens * setup.kv_bytes_per_token if n > 1 else 0
    note = f"{layers} layer(s) x {n} x {setup.tokens:,} tokens" if n > 1 else ""
    return Line("context parallel: gathered keys/values", size, "formula", (FWD, BWD), note)


def longest_sample(counts: Counts, trace: Trace, setup: Setup, budget: int) -> int:
    """The longest single sample that fits: a whole row on one GPU, or N chunks' worth."""
    return setup.context_parallel * largest_tokens(counts, trace, setup, budget)


LOWBIT_TEMPORARIES = 3
"""fp32 copies of one parameter that torchao's compiled 8-bit step holds at once: 2.0 measured on
the CPU (benchmarks/plan.py, the step's resident high-water mark; docs/plan.md), 3 kept as the
bound until torchao's Triton kernels are measured on a GPU."""


def step_temporaries(counts: Counts, setup: Setup, on_gpu: int) -> Line:
    """The optimizer step's temporaries (formula): torch's foreach AdamW copies the whole shard
    once in fp32 on CUDA, one parameter on the CPU; the lean modes step one parameter at a time
    in fp32."""
    if setup.optimizer == "adamw" and setup.param_bytes == 4:
        size = counts.shard_trainable * 4 if setup.cuda else counts.largest_param * 4
        note = "foreach AdamW: one fp32 copy of the shard; CPU: one parameter"
    else:
        copies = setup.step_copies or LOWBIT_TEMPORARIES
        size = copies * counts.largest_param * 4
        note = f"{copies} fp32 copies of the largest parameter (one parameter at a time)"
    return Line("optimizer step temporaries", size * on_gpu, "formula", (OPT,), note)


def largest_tokens(counts: Counts, trace: Trace, setup: Setup, budget: int) -> int:
    """The largest tokens per row whose peak fits `budget` bytes (0 if even 1 does not)."""

    def fits(tokens: int) -> bool:
        return memory(counts, trace, replace(setup, tokens=tokens)).peak <= budget

    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
        if high > 1 << 30:
            return low
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low
