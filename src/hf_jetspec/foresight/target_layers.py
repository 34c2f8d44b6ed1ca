"""Some of a target's own decoder layers, by reference, run over block rows with exact context.

Shared by the foresight decoder (the layers above the deepest read layer) and the layer-skip
adapter (a chosen subset below it). Context keys/values of each layer come from the target's true
*input* of that layer (``output_hidden_states`` index = layer index), so the verified prefix is
never recomputed; block rows (and predicted extra rows) attend to it and to themselves causally.
"""

from __future__ import annotations

from functools import partial

import torch

from ..drafter.drafter_cache import BlockAttention, DrafterCache
from ..drafter.layers import foreign_layer_forward, project_kv
from ..drafter.target_info import attention_shape, target_backbone, target_decoder_layers

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")


class TargetLayerChain:
    """The target layers ``layer_ids`` (in order) with the target's rotary embedding; nothing copied."""

    def __init__(self, target, layer_ids: list[int], owner: str):
        cfg = target.config.get_text_config()
        if cfg.model_type not in SUPPORTED_TYPES:
            raise ValueError(f"the {owner} supports {SUPPORTED_TYPES} targets, not {cfg.model_type!r}")
        layers = target_decoder_layers(target)
        self.layer_ids = list(layer_ids)
        self.layers = [layers[i] for i in self.layer_ids]
        self.rotary = target_backbone(target).rotary_emb
        self.num_heads, self.num_kv_heads, self.head_dim = attention_shape(target)

    def __len__(self) -> int:
        return len(self.layers)

    def new_cache(self) -> DrafterCache:
        return DrafterCache(len(self.layers))

    def kv(self, layer_inputs: list[torch.Tensor], positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys/values of rows at ``positions`` [T] given each layer's input ``layer_inputs[i]`` [1, T, H]."""
        if len(layer_inputs) != len(self.layers):
            raise ValueError(f"need the inputs of target layers {self.layer_ids}, got {len(layer_inputs)} tensors")
        if not self.layers:
            return []
        x0 = layer_inputs[0]
        cos, sin = self.rotary(x0, positions[None].to(x0.device))
        dtype = self.layers[0].self_attn.q_proj.weight.dtype
        return [project_kv(layer.self_attn, layer.input_layernorm(h.to(dtype)), cos, sin, self.num_kv_heads, self.head_dim)
                for layer, h in zip(self.layers, layer_inputs)]

    @torch.no_grad()
    def append_context(self, cache: DrafterCache, layer_inputs: list[torch.Tensor], positions: torch.Tensor) -> None:
        for i, (k, v) in enumerate(self.kv(layer_inputs, positions)):
            cache.append(i, k, v)

    @torch.no_grad()
    def run(self, cache: DrafterCache, x: torch.Tensor, start_positions: torch.Tensor, extra=None):
        """Run rows ``x`` [B, L, H] from ``start_positions`` [B]; returns (output, each layer's input).

        ``extra`` = (keys/values per layer, visibility [B, E]) adds predicted context rows.
        """
        bsz, length, _ = x.shape
        positions = start_positions.to(x.device)[:, None] + torch.arange(length, device=x.device)
        cos, sin = self.rotary(x, positions)
        attend = BlockAttention(cache, bsz, length, extra, True, x.device)
        inputs = []
        for i, layer in enumerate(self.layers):
            inputs.append(x)
            x = foreign_layer_forward(layer, x, cos, sin, attend.mask, partial(attend.keys, i), self.num_heads, self.num_kv_heads, self.head_dim)
        return x, inputs
