"""Build the sharded training model: read once by rank 0, FSDP2 shards everywhere.

Every rank builds the architecture on the meta device (no memory), shards it with `fully_shard`
per decoder block and then the root, and allocates only its shards. Rank 0 alone reads the
weights from disk, one tensor at a time (`models/loading.py`), and each is broadcast into the
shards: no rank ever holds the whole model, so host memory does not grow with the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM

from mini_trainer.distributed.runtime import Runtime
from mini_trainer.errors import UserError
from mini_trainer.method import MethodContext
from mini_trainer.models import support
from mini_trainer.models.loading import load_sharded_weights
from mini_trainer.models.moe import RouterStats, routing
from mini_trainer.optimizer_options import bf16_compute
from mini_trainer.training import context_attention, packed_attention
from mini_trainer.training.attention import attention_needs, pick_attention
from mini_trainer.training.compile import compile_layers
from mini_trainer.training.loss import LossFn, logit_head

log = logging.getLogger("mini_trainer")


@dataclass(frozen=True)
class ModelSpec:
    """What building the training model depends on, named: training (`of(args)`) and
    evaluation (a folder alone) call the same `build_model` with one, so neither fakes the
    other's argument object."""

    model_path: str
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    compile: bool = False
    param_dtype: str = "fp32"
    """`--param-dtype`: fp32 or bf16 master weights (and so gradients) in the shards."""

    @classmethod
    def of(cls, args) -> ModelSpec:
        """The model options of a run's `TrainingArgs`."""
        return cls(
            model_path=args.model_name_or_path,
            activation_checkpointing=args.activation_checkpointing,
            cpu_offload=args.cpu_offload,
            compile=args.compile,
            param_dtype=args.param_dtype,
        )


class CausalLMWithLoss(nn.Module):
    """A causal LM whose forward returns the summed token loss of a packed row.

    The loss is computed from the last hidden states and the output embedding by `loss_fn`
    (chunked or Liger), so the tokens x vocabulary logits are never materialised. Being the FSDP
    root, this module's forward runs with the root's parameters (embeddings, final norm, LM head)
    unsharded, so `lm_head.weight` can be handed to the loss directly.

    `loss_fn` is the model's own loss (training's), fixed when it is built; a caller that
    wants other sums (evaluation's statistics, bound to the micro-batch's samples) passes its
    function to the call, so the model is never changed between micro-batches.
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn | None):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        # The head's own transform (soft-cap, logit scale), applied inside the loss.
        self.head = logit_head(model.config)

    def forward(
        self,
        input_ids,
        position_ids,
        target_ids,
        loss_rows=None,
        *,
        loss_fn: LossFn | None = None,
        router: RouterStats | None = None,
        **attention_kwargs,
    ):
        """Summed loss of the row, by `loss_fn` when given, else by the model's own. The
        training loop passes what the collator built on the host (`loss_rows`, and the sample
        boundaries as `attention.attention_kwargs`), so the forward needs no host sync; without
        them, boundaries are found from the position ids. With `router` (training a mixture of
        experts), the router's auxiliary term is added as the family defines it and the
        routing is recorded there (`models/moe.py`)."""
        if loss_fn is None:
            loss_fn = self.loss_fn
        if loss_fn is None:
            raise TypeError("CausalLMWithLoss: built without a loss; pass loss_fn= to the call")
        if not attention_kwargs and self.model.config._attn_implementation == packed_attention.NAME:
            # Sample bounds once per micro-batch, not once per layer.
            bounds = [packed_attention.segment_bounds(row) for row in position_ids]
            attention_kwargs = {"packed_bounds": bounds}
        if router is not None:  # a mixture of experts in training: its routing is recorded
            attention_kwargs = {**attention_kwargs, "output_router_logits": True}
        out = self.model.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **attention_kwargs
        )
        head = self.model.get_output_embeddings()
        loss = loss_fn(
            out.last_hidden_state.flatten(0, 1), head.weight, target_ids.flatten(), rows=loss_rows,
            bias=head.bias, logit_scale=self.head.logit_scale, softcap=self.head.softcap,
        )  # fmt: skip
        if router is not None:
            loss = loss + router.add(out.router_logits, (target_ids != -100).sum())
        return loss


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder blocks, each of which becomes one FSDP unit."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise UserError(f"{type(model).__name__}: no decoder .layers to shard (unsupported model)")
    return list(layers)


def load_config(model_path: str, attention: str):
    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError) as error:
        raise UserError(f"{model_path}: not a readable model folder ({error})") from None
    config.use_cache = False  # a cache makes packed sequences attend to each other
    config._attn_implementation = attention
    return config


def meta_model(
    config,
    loss_fn: LossFn | None,
    method,
    context: MethodContext,
    *,
    activation_checkpointing: bool = False,
    log_main: bool = False,
) -> CausalLMWithLoss:
    """The training model on the meta device (no memory): adapted by the method (told about the
    run by `context`), activation checkpointing set, wrapped with the loss. Also what
    `mini-trainer plan` counts from. A model that cannot be trained exactly in packed rows is
    refused here, in one line (`models/support.py`)."""
    support.check_config(config)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except KeyError as error:
        refused = support.attention_refused(
            type(config).__name__.replace("Config", "ForCausalLM"), error,
            config._attn_implementation,
        )  # fmt: skip
        if refused is None:
            raise
        raise refused from None
    support.check_model(model, decoder_layers(model))
    method.adapt_model(model, context)
    if activation_checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        if log_main:
            log.info("activation checkpointing: every decoder layer")
    return CausalLMWithLoss(model, loss_fn)


def shard_policy(is_cuda: bool, cpu_offload: bool, bf16_params: bool = False) -> dict:
    """`fully_shard` keywords: bf16 compute with fp32 gradient reduction on CUDA; fp32 compute
    and reduction on the CPU, bf16 parameters gathered as fp32 (`bf16_compute`); parameters and
    gradients on the host with offload. The sharded weights and gradients keep their own dtype
    (fp32, or bf16 with `--param-dtype bf16`)."""
    kwargs = {}
    if bf16_compute(is_cuda):
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    elif bf16_params:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.float32, reduce_dtype=torch.float32
        )
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def fsdp_units(wrapped: CausalLMWithLoss) -> list[nn.Module]:
    """The modules `fully_shard` is applied to, in order: every decoder block, then the root
    (which keeps what no block owns: embeddings, final norm, LM head)."""
    return [*decoder_layers(wrapped.model), wrapped]


def build_model(
    spec: ModelSpec,
    loss_fn: LossFn | None,
    runtime: Runtime,
    method,
    context: MethodContext | None = None,
    context_group=None,
) -> tuple[CausalLMWithLoss, object]:
    """The FSDP2-sharded training model and its config, weights loaded from `spec.model_path`.

    `method` (mini_trainer/method.py) adapts the meta-device model before sharding (told about
    the run by `context`; without one, a model outside any run, as evaluation builds it) and
    converts rank 0 dense weights into the adapted model state before they are broadcast.
    `loss_fn` is the model own loss (None: every call passes one). With `context_group` (the
    rank's context-parallel process group, `--context-parallel N`) attention is the chunk's
    (training/context_attention.py) whatever the device: it needs `context_layout` per call.
    """
    # Every family accepts the per-sample path; the kernel is chosen once the model's
    # attention layers say what they need (windows, soft-caps, sinks).
    config = load_config(spec.model_path, packed_attention.register())
    if context is None:
        context = MethodContext(runtime, Path("."), None)
    wrapped = meta_model(
        config, loss_fn, method, context,
        activation_checkpointing=spec.activation_checkpointing, log_main=runtime.is_main,
    )  # fmt: skip
    attention = pick_attention(runtime, attention_needs(wrapped.model))
    if context_group is not None:
        routes = routing(wrapped.model)
        if routes is not None and routes.aux_coef:
            raise UserError(
                "--context-parallel: not with a mixture of experts' router loss (its "
                "load-balancing term is not a sum over tokens)"
            )
        attention = context_attention.register(context_group)
    if attention != wrapped.model.config._attn_implementation:
        wrapped.model.set_attn_implementation(attention)
    if runtime.is_main:
        log.info("attention implementation: %s", attention)
    if spec.param_dtype == "bf16":  # parameters only: buffers (rotary frequencies) keep fp32
        for param in wrapped.parameters():
            param.data = param.data.to(torch.bfloat16)
    if spec.compile:
        compile_layers(decoder_layers(wrapped.model), attention, runtime.is_cuda, runtime.is_main)
    if spec.cpu_offload and not runtime.is_cuda:
        raise UserError("--cpu-offload: needs a CUDA device; this run is on the CPU already")
    shard_kwargs = shard_policy(runtime.is_cuda, spec.cpu_offload, spec.param_dtype == "bf16")
    for unit in fsdp_units(wrapped):
        fully_shard(unit, **shard_kwargs)

    wrapped.to_empty(device="cpu" if spec.cpu_offload else runtime.device)
    # Rank 0 streams the checkpoint tensor by tensor into every rank's shards.
    load_sharded_weights(wrapped, spec.model_path, method.convert_weights, runtime)
    return wrapped, wrapped.model.config
