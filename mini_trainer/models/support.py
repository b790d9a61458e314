"""Which models mini-trainer can train exactly in packed rows, decided before any work.

Packed training is exact when every way a token sees other tokens goes through the attention
implementation mini-trainer registers (transformers' `AttentionInterface`): that is where each
sample is cut off from its neighbours in the row. A model is refused, in one line naming its
class and what it lacks, when it is not a causal LM transformers builds, when it is a multimodal
wrapper around a text model, when its attention does not take a registered implementation, or
when a layer mixes tokens otherwise (state-space, recurrent or convolution layers would carry
one sample's state into the next).

`check_config` runs on the config, `check_model` on the model built on the meta device; both
from `model_setup.meta_model`, which training, evaluation and `plan` share.
"""

from __future__ import annotations

import re

from torch import nn
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from mini_trainer.errors import UserError

TOKEN_MIXERS = re.compile(r"Mamba|SSM|Mixer|DeltaNet|ShortConv|RWKV|Recurrent|Retention|Hyena")
"""Class names of layers that carry information along the sequence without attention."""


def check_config(config) -> None:
    """Refuse a config no causal LM of transformers is built from, or a multimodal one."""
    name = type(config).__name__
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(
            f"{name} (model_type {config.model_type!r}): not a causal language model "
            "(transformers has no AutoModelForCausalLM for it)"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:
        raise UserError(
            f"{name} (model_type {config.model_type!r}): a multimodal model; mini-trainer trains "
            f"text models: give its text model ({type(text).__name__}, model_type "
            f"{text.model_type!r}) in a folder of its own"
        )


def attention_refused(model_class: str, error: Exception, attention: str) -> UserError | None:
    """The one line for a model whose attention does not take `attention` (transformers raises
    a KeyError naming it when a family keeps its own table of attention classes)."""
    if attention in str(error):
        return UserError(
            f"{model_class}: its attention does not take a registered implementation "
            "(transformers' AttentionInterface), which packed training needs"
        )
    return None


def check_model(model: nn.Module, layers: list[nn.Module]) -> None:
    """Refuse a model some of whose decoder layers mix tokens without attention, or have none."""
    name = type(model).__name__
    for index, layer in enumerate(layers):
        classes = [type(module).__name__ for module in layer.modules()]
        mixers = sorted(
            {cls for cls in classes if TOKEN_MIXERS.search(cls) and not cls.endswith("Norm")}
        )
        if mixers:
            raise UserError(
                f"{name}: layer {index} mixes tokens without attention ({', '.join(mixers)}): "
                "in a packed row its state would carry one sample into the next"
            )
        if not any("Attention" in cls for cls in classes):
            raise UserError(f"{name}: layer {index} has no attention layer (unsupported model)")
