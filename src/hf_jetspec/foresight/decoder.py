"""The foresight decoder: the target's own top layers, final norm and LM head, used by reference.

It turns the adapter's predicted states at the deepest read layer into ``p_hat(. | j)`` for every
block index j in one causal pass (seed 000, Section 4.2 and Appendix B.1). Its context is the
verified prefix, through keys/values computed from the target's true states (the inputs of each
reused layer, i.e. the outputs of the layer below), so nothing but the block is recomputed.
"""

from __future__ import annotations

import torch

from ..drafter_cache import DrafterCache, batched_prefix, context_block_mask
from ..layers import foreign_layer_forward, project_kv
from ..modeling_drafter import target_decoder_layers

SUPPORTED_TYPES = ("llama", "qwen2", "mistral")


class ForesightDecoder:
    """Frozen target layers ``deepest_read_layer + 1 .. L - 1`` + final norm + LM head (training-free).

    Nothing is copied or saved: the decoder holds references into ``target``. Use
    :attr:`state_indices` as extra ``output_hidden_states`` of the target's forwards: those are the
    true inputs of the reused layers, from which the decoder keys/values of the context come.
    """

    def __init__(self, target, deepest_read_layer: int):
        cfg = target.config.get_text_config()
        if cfg.model_type not in SUPPORTED_TYPES:
            raise ValueError(f"the foresight decoder supports {SUPPORTED_TYPES} targets, not {cfg.model_type!r}")
        layers = target_decoder_layers(target)
        if not 0 <= deepest_read_layer < len(layers) - 1:
            raise ValueError(f"the deepest read layer must be below the target's last layer (0..{len(layers) - 2}), got {deepest_read_layer}")
        self.target = target
        self.first_layer = deepest_read_layer + 1
        self.layers = list(layers)[self.first_layer :]
        base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
        self.norm = base.norm
        self.rotary = base.rotary_emb
        self.head = target.get_output_embeddings()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    @property
    def state_indices(self) -> list[int]:
        """``output_hidden_states`` indices of the reused layers' inputs (outputs of layers first-1 .. L-2)."""
        return [self.first_layer + i for i in range(len(self.layers))]

    def new_cache(self) -> DrafterCache:
        return DrafterCache(len(self.layers))

    def _cos_sin(self, x: torch.Tensor, positions: torch.Tensor):
        return self.rotary(x, positions)

    @torch.no_grad()
    def append_context(self, cache: DrafterCache, layer_inputs: list[torch.Tensor], positions: torch.Tensor) -> None:
        """Add verified positions: ``layer_inputs[i]`` [1, T, H] is the true input of reused layer i."""
        cos, sin = self._cos_sin(layer_inputs[0], positions[None].to(layer_inputs[0].device))
        for i, (layer, h) in enumerate(zip(self.layers, layer_inputs)):
            k, v = project_kv(layer.self_attn, layer.input_layernorm(h), cos, sin, self.num_kv_heads, self.head_dim)
            cache.append(i, k, v)

    @torch.no_grad()
    def extra_context(self, layer_inputs: list[torch.Tensor], positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys/values of predicted rows (``layer_inputs`` from :meth:`logits` with ``return_layer_inputs``)."""
        cos, sin = self._cos_sin(layer_inputs[0], positions[None].to(layer_inputs[0].device))
        return [
            project_kv(layer.self_attn, layer.input_layernorm(h), cos, sin, self.num_kv_heads, self.head_dim)
            for layer, h in zip(self.layers, layer_inputs)
        ]

    @torch.no_grad()
    def logits(self, cache: DrafterCache, top_states: torch.Tensor, start_positions: torch.Tensor, extra=None, return_layer_inputs: bool = False):
        """Target logits estimated from predicted states [B, L, H] at the deepest read layer.

        Row j of block b estimates the target's next-token logits after block index j. ``extra``
        (keys/values per layer, visibility [B, E]) adds predicted context rows.
        """
        bsz, length, _ = top_states.shape
        device = top_states.device
        positions = start_positions.to(device)[:, None] + torch.arange(length, device=device)
        x = top_states.to(self.head.weight.dtype)
        cos, sin = self._cos_sin(x, positions)
        mask = context_block_mask(bsz, length, len(cache), None if extra is None else extra[1], True, device)
        inputs = []
        for li, layer in enumerate(self.layers):
            inputs.append(x)
            prefix = batched_prefix(cache, li, extra, bsz)
            x = foreign_layer_forward(layer, x, cos, sin, mask, prefix, self.num_heads, self.num_kv_heads, self.head_dim)
        out = self.head(self.norm(x))
        return (out, inputs) if return_layer_inputs else out
