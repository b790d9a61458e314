"""Build the sharded training model: loaded once on rank 0, FSDP2 shards everywhere.

Every rank builds the architecture on the meta device (no memory), shards it with `fully_shard`
per decoder block and then the root, and allocates only its shards. Rank 0 alone reads the
weights from disk and they are broadcast into the shards, so host memory does not grow with the
number of ranks.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from mini_trainer.errors import UserError
from mini_trainer.training import packed_attention
from mini_trainer.training.distributed import Runtime, broadcast_object
from mini_trainer.training.loss import logit_head

log = logging.getLogger("mini_trainer")


class CausalLMWithLoss(nn.Module):
    """A causal LM whose forward returns the summed token loss of a packed row.

    The loss is computed from the last hidden states and the output embedding by `loss_fn`
    (chunked or Liger), so the tokens x vocabulary logits are never materialised. Being the FSDP
    root, this module's forward runs with the root's parameters (embeddings, final norm, LM head)
    unsharded, so `lm_head.weight` can be handed to the loss directly.
    """

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        # The head's own transform (soft-cap, logit scale), applied inside the loss.
        self.head = logit_head(model.config)

    def forward(self, input_ids, position_ids, target_ids) -> torch.Tensor:
        extra = {}
        if self.model.config._attn_implementation == packed_attention.NAME:
            # Sample bounds once per micro-batch, not once per layer (a host sync each on GPU).
            extra["packed_bounds"] = [packed_attention.segment_bounds(row) for row in position_ids]
        hidden = self.model.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, use_cache=False, **extra
        ).last_hidden_state
        head = self.model.get_output_embeddings()
        return self.loss_fn(
            hidden.flatten(0, 1), head.weight, target_ids.flatten(), bias=head.bias,
            logit_scale=self.head.logit_scale, softcap=self.head.softcap,
        )  # fmt: skip


def pick_attention(runtime: Runtime) -> str:
    """flash_attention_2 when it imports on CUDA, else sdpa run per packed sample.

    Both isolate the samples of a packed row and cost the samples' own attention.
    """
    if runtime.is_cuda:
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except (ImportError, OSError, RuntimeError) as error:  # e.g. built for another torch
            if runtime.is_main:
                log.warning("flash-attn does not import (%s); using per-sample sdpa", error)
    return packed_attention.register()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder blocks, each of which becomes one FSDP unit."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise UserError(f"{type(model).__name__}: no decoder .layers to shard (unsupported model)")
    return list(layers)


def load_config(model_path: str, attention: str):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError) as error:
        raise UserError(f"{model_path}: not a readable model folder ({error})") from None
    config.use_cache = False  # a cache makes packed sequences attend to each other
    config._attn_implementation = attention
    return config


def load_weights(model_path: str, config) -> tuple[dict, dict]:
    """Rank 0 only: (fp32 state dict, every buffer), keyed as in `CausalLMWithLoss`.

    Buffers are returned apart because non-persistent ones (rotary frequencies) are not in the
    state dict, yet the other ranks, built on the meta device, need their values too.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress output is the step lines
    model = _checked_from_pretrained(model_path, config)
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    buffers = {f"model.{key}": value.clone() for key, value in model.named_buffers()}
    return state, buffers


def _checked_from_pretrained(model_path: str, config):
    """The fp32 model, or `UserError` if its weights do not load or do not fit the config.

    transformers only warns about weights that are missing from the file (they start random)
    or that the config has no place for; training would then quietly start from noise or from
    a different model. (Weights of another shape it refuses itself.)
    """
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_path, config=config, dtype=torch.float32, output_loading_info=True
        )
    except Exception as error:  # noqa: BLE001 (safetensors, torch and OS errors alike)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"{model_path}: the weights do not load: {reason}") from None
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(info.get("missing_keys", ())) - tied)
    unexpected = sorted(info.get("unexpected_keys", ()))
    if missing or unexpected:
        names = ", ".join((missing + unexpected)[:3])
        more = len(missing) + len(unexpected) - 3
        names += f" and {more} more" if more > 0 else ""
        raise UserError(
            f"{model_path}: the weights do not match config.json ({len(missing)} missing, "
            f"{len(unexpected)} not in the config: {names})"
        )
    return model


def _weights_on_rank0(model_path: str, config, runtime: Runtime) -> tuple[dict, dict]:
    """`load_weights` on rank 0 (empty elsewhere); a `UserError` there is raised on every rank."""
    weights: tuple[dict, dict] = ({}, {})
    problem = None
    if runtime.is_main:
        try:
            weights = load_weights(model_path, config)
        except UserError as error:
            problem = error.lines
    problem = broadcast_object(problem, runtime)
    if problem:
        raise UserError(*problem)
    return weights


def build_model(args, loss_fn, runtime: Runtime, method) -> tuple[CausalLMWithLoss, object]:
    """The FSDP2-sharded training model and its config, weights loaded from the model folder.

    `method` (training/method.py) adapts the meta-device model before sharding and converts
    rank 0's dense weights into the adapted model's state before they are broadcast.
    """
    from transformers import AutoModelForCausalLM

    model_path = args.model_name_or_path
    attention = pick_attention(runtime)
    config = load_config(model_path, attention)
    if runtime.is_main:
        log.info("attention implementation: %s", attention)
    full_state, buffers = _weights_on_rank0(model_path, config, runtime)

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    method.adapt_model(model)
    if runtime.is_main:
        full_state = method.convert_weights(full_state)
    if args.activation_checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
        if runtime.is_main:
            log.info("activation checkpointing: every decoder layer")
    wrapped = CausalLMWithLoss(model, loss_fn)

    if args.cpu_offload and not runtime.is_cuda:
        raise UserError("--cpu-offload: needs a CUDA device; this run is on the CPU already")
    shard_kwargs = {}
    if runtime.is_cuda:  # bf16 compute, fp32 master weights and gradient reduction
        shard_kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if args.cpu_offload:
        shard_kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **shard_kwargs)
    fully_shard(wrapped, **shard_kwargs)

    wrapped.to_empty(device="cpu" if args.cpu_offload else runtime.device)
    set_model_state_dict(
        wrapped,
        full_state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    _set_buffers(wrapped, broadcast_object(buffers, runtime), runtime.device)
    return wrapped, config


def _set_buffers(module: nn.Module, values: dict[str, torch.Tensor], device) -> None:
    """Give every buffer rank 0's value, on the compute device (also under CPU offload)."""
    for name, _ in list(module.named_buffers()):
        owner_name, _, buffer_name = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        owner._buffers[buffer_name] = values[name].to(device)
