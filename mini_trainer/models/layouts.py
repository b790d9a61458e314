"""Checkpoint layouts: between the tensors a checkpoint holds and the parameters a model has.

transformers 5 keeps some weights in another layout in the model than on disk: mixture-of-experts
checkpoints (Mixtral, Qwen3-MoE, DeepSeek-V3) hold one tensor per expert
(`mlp.experts.0.down_proj.weight`) while the model has one fused 3-D parameter per layer
(`mlp.experts.down_proj`); Granite-MoE's checkpoints name its fused experts and router otherwise.
`from_pretrained` converts with the tables in `transformers.conversion_mapping`, and
`save_pretrained` converts back. This module applies the same tables, through transformers'
own conversion objects (no table is kept here), to a stream: the checkpoint's keys are grouped by
the parameter they become, and each group is read, converted and handed on alone, so the loader
still holds one parameter's worth of tensors at a time (all experts of one layer's projection).

gpt-oss checkpoints as OpenAI publishes them hold the experts in MXFP4 (`..._blocks`: two 4-bit
values per byte, `..._scales`: one power-of-two exponent per 32 values); each pair is
dequantized to fp32 with transformers' own `convert_moe_packed_tensors` into the model's dense
parameter. Export writes such a model dense (`--save-dtype`), with no `quantization_config`:
re-quantizing to MXFP4 is not done.

Keys here are the Hugging Face model's own (`model.layers.0...`, `lm_head.weight`).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import (
    PrefixChange,
    WeightConverter,
    dot_natural_key,
    rename_source_key,
    revert_weight_conversion,
)
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from mini_trainer.errors import UserError
from mini_trainer.models.safetensors_file import checkpoint_tensors, read_tensor

MXFP4_BLOCKS, MXFP4_SCALES = "_blocks", "_scales"


@dataclass
class LoadGroup:
    """Checkpoint tensors that together become one or more model tensors."""

    target: str
    """The model key the group is named by (the first target of a converter)."""
    sources: list[str]
    """Checkpoint keys, in transformers' order (experts 0, 1, ..., 10 numerically)."""
    pattern: str | None = None
    """The converter's source pattern each source matched; None: a plain rename, or MXFP4."""
    patterns: list[str] | None = None
    mxfp4: bool = False
    """`sources` are an MXFP4 (blocks, scales) pair of the dense `target`."""


class CheckpointLayout:
    """The conversions of one model (built on the meta device: nothing is allocated)."""

    def __init__(self, hf_model: nn.Module):
        self.model = hf_model
        mapping = get_model_conversion_mapping(hf_model, add_legacy=True)
        self.converters = [entry for entry in mapping if isinstance(entry, WeightConverter)]
        self.renamings = [entry for entry in mapping if not isinstance(entry, WeightConverter)]
        self.by_pattern = {p: conv for conv in self.converters for p in conv.source_patterns}
        self.model_keys = hf_model.state_dict(keep_vars=True)
        # Saving reverses the tables without the legacy renames and prefix changes, as
        # `save_pretrained` does for a model it did not load itself.
        self.reversible = bool(
            [
                entry
                for entry in get_model_conversion_mapping(hf_model, add_legacy=False)
                if not isinstance(entry, PrefixChange)
            ]
        )

    @property
    def converts(self) -> bool:
        """Whether any checkpoint key may need more than a rename."""
        return bool(self.converters)

    def groups(self, checkpoint_keys: list[str]) -> list[LoadGroup]:
        """The checkpoint's keys grouped by the model tensor they become, in checkpoint order
        of each group's first key. A key no table touches is a group of its own."""
        groups: dict[str, LoadGroup] = {}
        present = set(checkpoint_keys)
        for key in sorted(checkpoint_keys, key=dot_natural_key):
            stem = key.removesuffix(MXFP4_BLOCKS).removesuffix(MXFP4_SCALES)
            pair = (stem + MXFP4_BLOCKS, stem + MXFP4_SCALES)
            if stem != key and stem in self.model_keys and set(pair) <= present:
                groups.setdefault(stem, LoadGroup(stem, list(pair), mxfp4=True))
                continue
            renamed, pattern = rename_source_key(
                key, self.renamings, self.converters, self._prefix(), self.model_keys
            )
            if renamed not in self.model_keys and key in self.model_keys:
                renamed, pattern = key, None
            if pattern is None:
                groups[f"\0{key}"] = LoadGroup(renamed, [key])
                continue
            group = groups.setdefault(renamed, LoadGroup(renamed, [], pattern, []))
            group.sources.append(key)
            group.patterns.append(pattern)
        return list(groups.values())

    def convert(
        self, group: LoadGroup, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The model tensors of one group, from its checkpoint tensors (keyed by source)."""
        if group.mxfp4:
            blocks, scales = (tensors[source] for source in group.sources)
            dense = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            return {group.target: dense}
        if group.pattern is None:
            return {group.target: tensors[group.sources[0]]}
        converter = copy.deepcopy(self.by_pattern[group.pattern])
        for source, pattern in zip(group.sources, group.patterns, strict=True):
            converter.add_tensor(group.target, source, pattern, tensors[source])
        out = converter.convert(group.target, model=self.model, config=self.model.config)
        return {name: value[0] if isinstance(value, list) else value for name, value in out.items()}

    def to_checkpoint(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Model tensors (any complete set of one module's) in the checkpoint's own layout."""
        if not self.reversible:
            return tensors
        return revert_weight_conversion(self.model, tensors)

    def _prefix(self) -> str | None:
        return getattr(self.model, "base_model_prefix", None) or None


def read_model_tensors(model_dir: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """The named model tensors of a checkpoint folder (the model's own names), converted from
    the checkpoint's layout where it differs, one group at a time; a name no group gives is one
    line naming the folder. For readers outside training (the OSFT SVD cache, which reads its
    targets one by one: the folder's layout and groups are built once, `_groups_by_target`)."""
    entries = checkpoint_tensors(model_dir)
    wanted = [name for name in names if name not in entries]
    out = {name: read_tensor(entries[name]) for name in names if name in entries}
    if wanted:
        layout, groups = _groups_by_target(str(Path(model_dir).resolve()))
        for name in wanted:
            group = groups.get(name)
            if group is None:
                raise UserError(f"{model_dir}: weight {name} not found in the safetensors files")
            read = {source: read_tensor(entries[source]) for source in group.sources}
            out[name] = layout.convert(group, read)[name]
    return {name: out[name] for name in names}


@functools.lru_cache(maxsize=4)
def _groups_by_target(model_dir: str) -> tuple[CheckpointLayout, dict[str, LoadGroup]]:
    """A folder's layout (its model on the meta device) and checkpoint groups by target."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    layout = CheckpointLayout(model)
    groups = layout.groups(list(checkpoint_tensors(model_dir)))
    return layout, {group.target: group for group in groups}
