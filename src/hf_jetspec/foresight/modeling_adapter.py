"""ForesightAdapter: predicts the target's hidden states of the block under verification."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers import PreTrainedModel

from ..drafter.drafter_cache import BlockAttention, DrafterCache
from ..drafter.layers import DecoderLayer, RotaryTable
from ..drafter.masks import PackedBlocks, context_visibility
from ..drafter.target_info import check_target_matches, target_decoder_layers, target_shape_fields
from .configuration_adapter import ForesightAdapterConfig

ExtraContext = tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
"""Predicted context rows shared by a batch: per-layer keys/values [1, kv, E, D] and visibility [B, E]."""


class ForesightAdapter(PreTrainedModel):
    """Hidden-to-hidden adapter of foresight drafting (seed 000, Section 4.2, Appendix A).

    For every target layer the drafter reads it predicts, in one parallel causal pass, the target's
    states of the ``gamma + 1`` block positions ``[y0, d_1 .. d_gamma]`` before the target has read
    them. Module m attends to the target's true states of the verified context at its layer and
    reads the prediction of module m - 1 (token embeddings for m = 0). The prediction layout is the
    drafter's context layout (read layers concatenated on the last dim), so predicted rows can stand
    in for true ones in the drafter's context.

    The target's input embeddings are referenced, never saved; modules start as copies of the target
    layers ``config.source_layers`` (:meth:`for_target`).
    """

    config_class = ForesightAdapterConfig
    base_model_prefix = "adapter"
    main_input_name = "block_input_ids"
    _no_split_modules = ["DecoderLayer"]

    def __init__(self, config: ForesightAdapterConfig):
        super().__init__(config)
        self.stacks = nn.ModuleList(nn.ModuleList(DecoderLayer.from_config(config) for _ in src) for src in config.source_layers)
        self.__dict__["_target"] = None
        self._rotary_table = RotaryTable(config.head_dim, config.rope_theta)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_target(cls, target, target_layer_ids: list[int] | None = None, layers_per_module: int = 1, init_from_target: bool = True, **overrides):
        """A fresh adapter for ``target`` reading ``target_layer_ids`` (pass the drafter's)."""
        values = target_shape_fields(target)
        if target_layer_ids is not None:
            values["target_layer_ids"] = list(target_layer_ids)
        values["layers_per_module"] = layers_per_module
        values.update(overrides)
        adapter = cls(ForesightAdapterConfig(**values)).to(target.device)
        if init_from_target:
            adapter.init_from_target(target)
        adapter.attach_target(target)
        return adapter

    @classmethod
    def for_drafter(cls, drafter, **kwargs) -> "ForesightAdapter":
        """A fresh adapter predicting exactly the states ``drafter`` reads."""
        return cls.for_target(drafter.target, target_layer_ids=drafter.config.target_layer_ids, **kwargs)

    @torch.no_grad()
    def init_from_target(self, target) -> None:
        src = target_decoder_layers(target)
        for stack, ids in zip(self.stacks, self.config.source_layers):
            for mine, lid in zip(stack, ids):
                state = src[lid].state_dict()
                mine.load_state_dict({k: state[k].to(self.dtype) for k in mine.state_dict()})

    def check_target(self, target) -> None:
        check_target_matches(self.config, target, "ForesightAdapter", "ForesightAdapter.for_target(target)", "adapter")

    def check_drafter(self, drafter) -> None:
        if list(drafter.config.target_layer_ids) != list(self.config.target_layer_ids):
            raise ValueError(
                f"the foresight adapter predicts target layers {self.config.target_layer_ids} but the drafter reads "
                f"{drafter.config.target_layer_ids}; train the adapter for this drafter (ForesightAdapter.for_drafter)"
            )

    def attach_target(self, target, follow_dtype: bool = True) -> None:
        """Validate and reference ``target``; the adapter follows its device and (unless
        ``follow_dtype=False``) its floating dtype."""
        self.check_target(target)
        if self.device != target.device or (follow_dtype and self.dtype != target.dtype):
            self.to(device=target.device, dtype=target.dtype if follow_dtype else self.dtype)
        self.__dict__["_target"] = target

    @property
    def target(self):
        if self.__dict__["_target"] is None:
            raise RuntimeError("this adapter has no target attached: call adapter.attach_target(target)")
        return self.__dict__["_target"]

    # ------------------------------------------------------------------ helpers
    @property
    def num_cache_layers(self) -> int:
        return sum(len(s) for s in self.stacks)

    def _flat_layers(self):
        i = 0
        for m, stack in enumerate(self.stacks):
            for layer in stack:
                yield i, m, layer
                i += 1

    def _rotary(self, positions: torch.Tensor):
        return self._rotary_table(positions, self.dtype, self.device)

    def _slice(self, states: torch.Tensor, m: int) -> torch.Tensor:
        h = self.config.hidden_size
        return states[..., m * h : (m + 1) * h].to(self.dtype)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.target.get_input_embeddings()
        return emb(ids.to(emb.weight.device)).to(device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ inference
    def new_cache(self) -> DrafterCache:
        return DrafterCache(self.num_cache_layers)

    @property
    def state_indices(self) -> list[int]:
        """Extra ``output_hidden_states`` this adapter needs: none (it reads the drafter's read layers)."""
        return []

    @torch.no_grad()
    def append_context(self, cache: DrafterCache, target_states: torch.Tensor, positions: torch.Tensor, layer_inputs=None) -> None:
        """Add verified positions (true read-layer states [1, T, n*H]) to the adapter's cache."""
        cos, sin = self._rotary(positions[None])
        for i, m, layer in self._flat_layers():
            k, v = layer.context_kv(self._slice(target_states.to(self.device), m), cos, sin)
            cache.append(i, k, v)

    @torch.no_grad()
    def extra_context(self, predicted_states: torch.Tensor, positions: torch.Tensor, layer_inputs=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys/values of predicted rows [1, E, n*H] at ``positions`` [E] (context for pre-drafted blocks)."""
        cos, sin = self._rotary(positions[None])
        return [layer.context_kv(self._slice(predicted_states.to(self.device), m), cos, sin) for _, m, layer in self._flat_layers()]

    @torch.no_grad()
    def predict(self, cache: DrafterCache, block_ids: torch.Tensor, start_positions: torch.Tensor, extra: ExtraContext | None = None,
                return_layer_inputs: bool = False):
        """Predicted read-layer states [B, L, n*H] of blocks ``block_ids`` [B, L] starting at ``start_positions`` [B].

        Every block sees the whole cached context, the ``extra`` rows it is marked to see, and
        itself causally. ``return_layer_inputs`` adds ``[]`` (the interface of
        :class:`~hf_jetspec.foresight.LayerSkipAdapter`; this adapter's extra rows need only the states).
        """
        bsz, length = block_ids.shape
        device = self.device
        positions = start_positions.cpu()[:, None] + torch.arange(length)
        cos, sin = self._rotary(positions)
        attend = BlockAttention(cache, bsz, length, extra, True, device)
        x = self._embed(block_ids)
        preds = []
        for stack_start, stack in zip(self._stack_starts(), self.stacks):
            for j, layer in enumerate(stack):
                x = layer(x, cos, sin, attend.mask, partial(attend.keys, stack_start + j))
            preds.append(x)
        pred = torch.cat(preds, dim=-1)
        return (pred, []) if return_layer_inputs else pred

    def _stack_starts(self) -> list[int]:
        out, i = [], 0
        for stack in self.stacks:
            out.append(i)
            i += len(stack)
        return out

    # ------------------------------------------------------------------ training
    def forward(self, context_states: torch.Tensor, block_input_ids: torch.Tensor, anchor_positions: torch.Tensor) -> torch.Tensor:
        """Predictions for many blocks packed against one context (the training view, chained as at inference).

        Args:
            context_states: [B, T, n*H] true read-layer states of the sequences.
            block_input_ids: [B, nb, L] block tokens; block b starts at ``anchor_positions[:, b]``.
            anchor_positions: [B, nb]; each block sees the context rows before its anchor.
        Returns: predicted states [B, nb, L, n*H].
        """
        bsz, nb, length = block_input_ids.shape
        t = context_states.shape[1]
        device = self.device
        ctx_pos = torch.arange(t, device=device)[None].expand(bsz, t)
        ctx_cos, ctx_sin = self._rotary(ctx_pos)
        positions = (anchor_positions.to(device)[:, :, None] + torch.arange(length, device=device)).reshape(bsz, nb * length)
        cos, sin = self._rotary(positions)
        mask = PackedBlocks(context_visibility(anchor_positions.to(device), t), length, causal=True)
        x = self._embed(block_input_ids.reshape(bsz, nb * length))
        preds = []
        for m, stack in enumerate(self.stacks):
            ctx = self._slice(context_states.to(device), m)
            for layer in stack:
                x = layer(x, cos, sin, mask, layer.context_kv(ctx, ctx_cos, ctx_sin))
            preds.append(x)
        return torch.cat(preds, dim=-1).reshape(bsz, nb, length, -1)
