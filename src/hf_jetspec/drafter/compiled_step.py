"""An optional compiled drafting step: one block forward with static shapes (``torch.compile``).

Off by default (``DraftingConfig(compile=True)`` turns it on); ``benchmarks/round_cost.py`` with a
``@compile`` tree measures what it costs to compile and what it saves per round.

Shapes are made static the way static-cache decoders do it: the block writes its keys/values by
index at ``n .. n + L - 1`` (``n`` = context length, a tensor, so it does not specialise the
graph), and attention runs over the cache's whole buffer with a mask that hides the rows past the
block. The buffer's capacity is a power of two that doubles as the context grows (256, 512, ...),
so attention never spans more than twice the rows in use, and each (block length, capacity) pair
compiles once and then serves every round of every ``generate`` call. A block that does not fit
the buffer runs eagerly (which grows the buffer). A causal drafter's shorter blocks (the last rounds
before ``max_length``) are padded at the end to a length already compiled: no row attends to a later
one, so the padding changes no real row, and no new graph compiles for them. Each (block length,
capacity, arithmetic) triple is one graph of the same function, more than dynamo's default limit
of 8 graphs per function once contexts reach a few capacities with both float and int8 drafting;
past that limit dynamo would run the step eagerly, slower than the ordinary eager path, so the step
raises the limit while it compiles (:data:`MAX_GRAPHS`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layers import project_kv, project_q


def static_block_forward(drafter, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n: torch.Tensor,
                         keys: list[torch.Tensor], values: list[torch.Tensor], causal: bool,
                         window: int | None = None) -> torch.Tensor:
    """Draft-vocabulary logits [1, L, V] of one block ``x`` [1, L, H] (embedded) after ``n`` context rows.

    ``keys`` / ``values`` are the cache's full per-layer buffers [1, kv, capacity, D]; the block's
    rows are written into them at ``n ..`` (scratch rows: the context length does not move)."""
    length = x.shape[1]
    capacity = keys[0].shape[2]
    rows = n + torch.arange(length, device=x.device)
    cols = torch.arange(capacity, device=x.device)
    mask = cols[None, :] <= rows[:, None] if causal else (cols < n + length)[None, :].expand(length, capacity)
    if window is not None:
        mask = mask & ((rows[:, None] - cols[None, :]).abs() < window)
    for layer, k_buf, v_buf in zip(drafter.layers, keys, values):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        b, t, _ = h.shape
        q = project_q(attn, h, cos, sin, attn.num_heads, attn.head_dim)
        k, v = project_kv(attn, h, cos, sin, attn.num_kv_heads, attn.head_dim)
        k_buf.index_copy_(2, rows, k)
        v_buf.index_copy_(2, rows, v)
        out = F.scaled_dot_product_attention(q, k_buf, v_buf, attn_mask=mask[None, None], enable_gqa=attn.num_kv_heads != attn.num_heads)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, attn.num_heads * attn.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.draft_logits(x)


MAX_GRAPHS = 64  # graphs the step may hold: block lengths x capacities x {float, int8}


class CompiledDraftStep:
    """``torch.compile`` of :func:`static_block_forward` for one drafter (one graph per block length and
    cache capacity)."""

    def __init__(self):
        self.fn = torch.compile(static_block_forward, dynamic=False)
        self.calls = 0
        self.shapes: set[tuple[int, int, bool]] = set()  # (block length, capacity, int8): one graph each

    @property
    def lengths(self) -> set[int]:
        """Block lengths run so far (each compiled at least at one capacity)."""
        return {shape[0] for shape in self.shapes}

    def length_for(self, length: int, causal: bool) -> int:
        """The block length to run a block of ``length`` rows at: for a causal drafter the shortest
        length already run that is at least as long (padding rows at the end), else ``length``."""
        longer = [n for n in self.lengths if n >= length] if causal else []
        return min(longer) if longer else length

    def usable(self, cache, length: int) -> bool:
        """Whether ``cache``'s buffers are allocated and have room for a block of ``length`` rows."""
        keys, _ = cache.buffers
        return bool(keys) and keys[0] is not None and len(cache) + length <= keys[0].shape[2]

    def __call__(self, drafter, cache, x, cos, sin, causal: bool) -> torch.Tensor:
        self.calls += 1
        n = torch.tensor(len(cache), device=x.device)
        keys, values = cache.buffers
        args = (drafter, x, cos, sin, n, keys, values, causal, drafter.config.sliding_window)
        shape = (x.shape[1], keys[0].shape[2], drafter.int8_drafting)
        if shape in self.shapes:  # its graph exists: no compile, no limit to raise (the patch costs ~30 us)
            return self.fn(*args)
        self.shapes.add(shape)
        with torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS):
            return self.fn(*args)
