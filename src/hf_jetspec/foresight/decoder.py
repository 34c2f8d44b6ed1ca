"""The foresight decoder: the target's own top layers, final norm and LM head, used by reference.

It turns the adapter's predicted states at the deepest read layer into ``p_hat(. | j)`` for every
block index j in one causal pass (seed 000, Section 4.2 and Appendix B.1). Its context is the
verified prefix, through keys/values computed from the target's true states (the inputs of each
reused layer, i.e. the outputs of the layer below), so nothing but the block is recomputed.
"""

from __future__ import annotations

import torch

from ..drafter.drafter_cache import DrafterCache
from ..drafter.target_info import target_backbone, target_decoder_layers
from .target_layers import SUPPORTED_TYPES, TargetLayerChain

__all__ = ["ForesightDecoder", "SUPPORTED_TYPES"]


class ForesightDecoder:
    """Frozen target layers ``deepest_read_layer + 1 .. L - 1`` + final norm + LM head (training-free).

    Nothing is copied or saved: the decoder holds references into ``target``. Use
    :attr:`state_indices` as extra ``output_hidden_states`` of the target's forwards: those are the
    true inputs of the reused layers, from which the decoder keys/values of the context come.
    """

    def __init__(self, target, deepest_read_layer: int):
        num_layers = len(target_decoder_layers(target))
        if not 0 <= deepest_read_layer < num_layers - 1:
            raise ValueError(f"the deepest read layer must be below the target's last layer (0..{num_layers - 2}), got {deepest_read_layer}")
        self.chain = TargetLayerChain(target, list(range(deepest_read_layer + 1, num_layers)), "foresight decoder")
        self.norm = target_backbone(target).norm
        self.head = target.get_output_embeddings()

    @property
    def state_indices(self) -> list[int]:
        """``output_hidden_states`` indices of the reused layers' inputs (outputs of layers first-1 .. L-2)."""
        return list(self.chain.layer_ids)

    def new_cache(self) -> DrafterCache:
        return self.chain.new_cache()

    @torch.no_grad()
    def append_context(self, cache: DrafterCache, layer_inputs: list[torch.Tensor], positions: torch.Tensor) -> None:
        """Add verified positions: ``layer_inputs[i]`` [1, T, H] is the true input of reused layer i."""
        self.chain.append_context(cache, layer_inputs, positions)

    @torch.no_grad()
    def extra_context(self, layer_inputs: list[torch.Tensor], positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys/values of predicted rows (``layer_inputs`` from :meth:`logits` with ``return_layer_inputs``)."""
        return self.chain.kv(layer_inputs, positions)

    @torch.no_grad()
    def hidden(self, cache: DrafterCache, top_states: torch.Tensor, start_positions: torch.Tensor, extra=None):
        """Final hidden states [B, L, H] (before the norm) from predicted states [B, L, H] at the deepest
        read layer, and each reused layer's input. ``extra`` (keys/values per layer, visibility [B, E])
        adds predicted context rows."""
        return self.chain.run(cache, top_states.to(self.head.weight.dtype), start_positions, extra)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head of the rows it is given (only the rows a caller needs)."""
        return self.head(self.norm(hidden))

    @torch.no_grad()
    def logits(self, cache: DrafterCache, top_states: torch.Tensor, start_positions: torch.Tensor, extra=None, return_layer_inputs: bool = False):
        """Target logits estimated from predicted states [B, L, H] at the deepest read layer.

        Row j of block b estimates the target's next-token logits after block index j.
        """
        x, inputs = self.hidden(cache, top_states, start_positions, extra)
        out = self.head_logits(x)
        return (out, inputs) if return_layer_inputs else out
