"""`--compile`: each decoder layer's forward compiled with `torch.compile` (regional compilation).

Only the layer's `forward` is compiled, in place (the module, its parameter names and its
checkpoint keys are unchanged), so what wraps it stays eager and composes as before: FSDP2's
per-layer unshard/reshard hooks run around the compiled code, activation checkpointing re-runs
it in backward, OSFT's factorized linears are traced inside it, and the chunked loss runs on
the root outside it. All layers share one compiled code object.

Packed attention cannot be traced: the per-sample path loops over Python sample bounds, and the
varlen kernels take an int maximum length, both new every micro-batch, so tracing them would
specialise (recompile) on every batch. The compiled layer therefore receives no boundaries: the
wrapper moves them into a context variable, and the attention function, registered again with
`torch.compiler.disable`, takes them back (one graph break per layer, around attention). The
token dimension is marked dynamic, so a run compiles a handful of graphs, not one per length;
every new compilation is counted and logged on rank 0.

A compile failure (no C++ compiler for inductor on the CPU, an unsupported model) stops the run
with one line; there is no silent fallback to eager.
"""

from __future__ import annotations

import contextvars
import functools
import logging

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from mini_trainer.errors import UserError

log = logging.getLogger("mini_trainer")

ATTENTION_KWARGS = ("packed_bounds", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                    "max_length_k")  # fmt: skip
"""Per-micro-batch sample boundaries, handed to attention outside the compiled graph."""

_boundaries: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "packed_boundaries", default=None
)


def compiler_missing(is_cuda: bool) -> str | None:
    """Why inductor cannot build kernels here, or None. On the CPU it compiles C++ (`CXX`)."""
    if is_cuda:
        return None
    # deferred: torch._inductor, only with --compile
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as error:  # InvalidCxxCompiler and whatever the search raises
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"no usable C++ compiler for inductor ({first})"
    return None


def compile_counts() -> tuple[int, int]:
    """(compilations, graphs) so far in this process, from dynamo's counters: a compilation
    is one frame compiled (a first compile or a recompile), holding one or more graphs."""
    # deferred: torch._dynamo, only with --compile
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"]), int(counters["stats"]["unique_graphs"])


class CompileLog:
    """Logs (rank 0) every time the compiled layers compiled something new."""

    def __init__(self, is_main: bool):
        self.is_main = is_main
        self.seen = compile_counts()

    def check(self, tokens: int) -> None:
        now = compile_counts()
        if now != self.seen and self.is_main:
            log.info(
                "compile: %d compilations, %d graphs so far (this one for a row of %d tokens)",
                *now, tokens,
            )  # fmt: skip
        self.seen = now


def _mark_tokens_dynamic(value) -> None:
    """Dimension 1 (tokens) of every (batch, tokens, ...) tensor, also inside tuples."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2:
        torch._dynamo.maybe_mark_dynamic(value, 1)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _mark_tokens_dynamic(item)


def _compiled_forward(forward, compile_log: CompileLog):
    compiled = torch.compile(forward)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        boundaries = {k: kwargs.pop(k) for k in ATTENTION_KWARGS if k in kwargs}
        for value in (*args, *kwargs.values()):
            _mark_tokens_dynamic(value)
        token = _boundaries.set(boundaries)
        try:
            out = compiled(*args, **kwargs)
        except (
            torch._dynamo.exc.TorchDynamoException,
            torch._dynamo.exc.FailOnRecompileLimitHit,
        ) as error:  # never fall back to eager
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UserError(f"--compile: torch.compile failed on this platform: {first}") from None
        finally:
            _boundaries.reset(token)
        hidden = args[0] if args else kwargs.get("hidden_states")
        compile_log.check(hidden.shape[1] if isinstance(hidden, torch.Tensor) else -1)
        return out

    return run


def _eager_attention(attention):
    """`attention` run outside the graph, with the boundaries the compiled layer set aside."""

    @torch.compiler.disable
    def run(module, query, key, value, attention_mask, **kwargs):
        return attention(
            module, query, key, value, attention_mask, **(_boundaries.get() or {}), **kwargs
        )

    run.mini_trainer_wraps = attention
    return run


def compile_layers(layers: list[nn.Module], attention_name: str, is_cuda: bool,
                   is_main: bool) -> None:  # fmt: skip
    """Compile every layer's forward in place; re-register `attention_name` to run eagerly."""
    missing = compiler_missing(is_cuda)
    if missing:
        raise UserError(f"--compile: torch.compile cannot build kernels on this machine: {missing}")
    # Past dynamo's recompile limit a frame would run eagerly, unannounced: make it an error.
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    attention = ALL_ATTENTION_FUNCTIONS[attention_name]
    attention = getattr(attention, "mini_trainer_wraps", attention)  # registered once per name
    AttentionInterface.register(attention_name, _eager_attention(attention))
    compile_log = CompileLog(is_main)
    for layer in layers:
        layer.forward = _compiled_forward(layer.forward, compile_log)
    if is_main:
        log.info("compile: %d decoder layers (torch.compile, token dimension dynamic)",
                 len(layers))  # fmt: skip
