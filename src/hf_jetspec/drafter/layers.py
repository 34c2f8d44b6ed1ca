"""Small transformer building blocks shared by the drafter (and later the foresight adapter).

The layers follow the Llama/Qwen2 parameter naming (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm`` ...) so that a drafter layer can be initialised from one of the target's own
decoder layers with a plain ``load_state_dict``. Attention takes an explicit boolean mask, which is
what lets one layer serve both the incremental inference path (queries = block, keys = cached
context + block) and the training path (many blocks packed against one context).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .masks import PackedBlocks


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cos/sin tables of rotary position embeddings for integer ``positions`` (any shape).

    Returns tensors of shape ``positions.shape + (head_dim,)`` using the half-split convention of
    Llama-family models.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class RotaryTable:
    """Cos/sin tables of :func:`rotary_cos_sin` for positions ``0 .. capacity - 1``, built once per
    dtype and device and grown by doubling; lookups index the table (same values, no trigonometry).

    Give positions on the CPU where possible (the inference paths do): their range is then read
    without a device synchronisation; the result is on ``device``."""

    def __init__(self, head_dim: int, theta: float, capacity: int = 1024):
        self.head_dim = head_dim
        self.theta = theta
        self.capacity = capacity
        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        device = torch.device(device) if device is not None else positions.device
        top = int(positions.max()) + 1 if positions.numel() else 0
        if top > self.capacity:
            while self.capacity < top:
                self.capacity *= 2
            self._tables.clear()
        key = (dtype, device)
        table = self._tables.get(key)
        if table is None:
            table = rotary_cos_sin(torch.arange(self.capacity, device=device), self.head_dim, self.theta, dtype)
            self._tables[key] = table
        index = positions.to(device)
        return table[0][index], table[1][index]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape [B, heads, T, D] by cos/sin of shape [B, T, D]."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Llama-named attention; with ``qk_norm`` each head's queries and keys are RMS-normalised before
    the rotation (``q_norm`` / ``k_norm``, as in Qwen3 and DFlash drafters)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool = False,
        qk_norm: bool = False,
        eps: float = 1e-6,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values for ``x`` [B, T, H] -> two tensors [B, kv_heads, T, D]."""
        return project_kv(self, x, cos, sin, self.num_kv_heads, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        prefix_kv=None,
    ) -> torch.Tensor:
        """Attend from ``x`` [B, T, H] to ``prefix_kv`` (if any) followed by ``x`` itself.

        ``prefix_kv`` is a ``(keys, values)`` pair placed before the block's own, or a function
        ``(k, v) -> (keys, values)`` that returns the full keys/values (a cache writing the block
        rows in place, see :class:`~hf_jetspec.drafter.drafter_cache.BlockAttention`). ``mask`` is boolean,
        broadcastable to [B, 1, T, P + T] (True = may attend), or None (attend to everything).
        """
        return attention_forward(self, x, cos, sin, mask, prefix_kv, self.num_heads, self.num_kv_heads, self.head_dim)


def _heads(x: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """[B, T, heads * D] -> [B, heads, T, D]."""
    b, t, _ = x.shape
    return x.view(b, t, num_heads, head_dim).transpose(1, 2)


def _head_norm(attn: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """Per-head RMS norm ``attn.<name>`` (``q_norm`` / ``k_norm``) where the module has one."""
    norm = getattr(attn, name, None)
    return x if norm is None else norm(x)


def project_q(attn: nn.Module, x: torch.Tensor, cos, sin, num_heads: int, head_dim: int) -> torch.Tensor:
    """Rotated queries [B, heads, T, D] of any Llama-named attention module (``q_norm`` applied if present)."""
    return apply_rotary(_head_norm(attn, "q_norm", _heads(attn.q_proj(x), num_heads, head_dim)), cos, sin)


def project_kv(attn: nn.Module, x: torch.Tensor, cos, sin, num_kv_heads: int, head_dim: int):
    """Rotated keys and values [B, kv_heads, T, D] of any Llama-named attention module (``k_norm`` applied if present)."""
    k = _head_norm(attn, "k_norm", _heads(attn.k_proj(x), num_kv_heads, head_dim))
    return apply_rotary(k, cos, sin), _heads(attn.v_proj(x), num_kv_heads, head_dim)


def attention_forward(attn: nn.Module, x, cos, sin, mask, prefix_kv, num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Masked attention through the projections of any Llama-named attention module.

    Serves the drafter's own layers and, by reference, a target's layers (the foresight decoder),
    whose ``forward`` has another signature.
    """
    b, t, _ = x.shape
    q = project_q(attn, x, cos, sin, num_heads, head_dim)
    k, v = project_kv(attn, x, cos, sin, num_kv_heads, head_dim)
    if isinstance(mask, PackedBlocks):
        out = packed_block_attention(q, prefix_kv[0].to(k.dtype), prefix_kv[1].to(v.dtype), k, v, mask)
        return attn.o_proj(out.transpose(1, 2).reshape(b, t, num_heads * head_dim))
    if callable(prefix_kv):
        k, v = prefix_kv(k, v)
    elif prefix_kv is not None:
        k = torch.cat([prefix_kv[0].to(k.dtype), k], dim=2)
        v = torch.cat([prefix_kv[1].to(v.dtype), v], dim=2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=num_kv_heads != num_heads)
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, num_heads * head_dim))


def packed_block_attention(q, k_ctx, v_ctx, k_blk, v_blk, blocks: PackedBlocks) -> torch.Tensor:
    """Attention of packed blocks under :class:`~hf_jetspec.drafter.masks.PackedBlocks`.

    ``q`` [B, heads, nb * L, D]; ``k_ctx``/``v_ctx`` [B, kv_heads, C, D]; ``k_blk``/``v_blk``
    [B, kv_heads, nb * L, D]. Each block's rows score the context and their own block only (``nb``
    L x L tiles instead of an ``nb * L``-wide strip, most of it masked), and one softmax runs over
    both parts in float32. Equals ``scaled_dot_product_attention`` under ``blocks.dense()`` (the
    tests hold it to that); grouped-query heads share their key/value head without a copy.
    """
    bsz, heads, rows, dim = q.shape
    kv_heads, ctx_len = k_ctx.shape[1], k_ctx.shape[2]
    nb, length = blocks.ctx_visible.shape[1], blocks.block_len
    group = heads // kv_heads
    scale = dim ** -0.5
    q_ctx = q.reshape(bsz, kv_heads, group * rows, dim)  # the heads of one group share their key/value head
    s_ctx = (q_ctx @ k_ctx.transpose(-1, -2)).view(bsz, kv_heads, group, nb, length, ctx_len).float() * scale
    q_blk = q.reshape(bsz, kv_heads, group, nb, length, dim)
    s_blk = (q_blk @ k_blk.reshape(bsz, kv_heads, 1, nb, length, dim).transpose(-1, -2)).float() * scale
    s_ctx = s_ctx.masked_fill(~blocks.ctx_visible.to(q.device)[:, None, None, :, None, :], float("-inf"))
    inner = blocks.inner(q.device)
    if inner.dim() == 4:  # truncated blocks: [B, nb, L, L] -> the scores' [B, kv, group, nb, L, L]
        inner = inner[:, None, None]
    s_blk = s_blk.masked_fill(~inner, float("-inf"))
    p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1).to(q.dtype)  # a row always sees itself
    out = (p[..., :ctx_len].reshape(bsz, kv_heads, group * rows, ctx_len) @ v_ctx).view(bsz, kv_heads, group, nb, length, dim)
    out = out + p[..., ctx_len:] @ v_blk.reshape(bsz, kv_heads, 1, nb, length, dim)
    return out.reshape(bsz, heads, rows, dim)


def foreign_layer_forward(layer: nn.Module, x, cos, sin, mask, prefix_kv, num_heads: int, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """A Llama/Qwen2 decoder layer of a target run with an explicit mask and prefix keys/values."""
    h = attention_forward(layer.self_attn, layer.input_layernorm(x), cos, sin, mask, prefix_kv, num_heads, num_kv_heads, head_dim)
    x = x + h
    return x + layer.mlp(layer.post_attention_layernorm(x))


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm transformer layer (attention + SwiGLU MLP) with Llama parameter names.

    Context rows reach the keys/values through ``input_layernorm`` (``context_input_norm=True``, JetSpec)
    or straight from the projected context (``False``, DFlash / MuseGlimmerAssistant)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        attention_bias: bool = False,
        qk_norm: bool = False,
        context_input_norm: bool = True,
    ):
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads, num_kv_heads, head_dim, bias=attention_bias, qk_norm=qk_norm, eps=eps)
        self.mlp = MLP(hidden_size, intermediate_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.context_input_norm = context_input_norm

    @classmethod
    def from_config(cls, config) -> "DecoderLayer":
        """A layer shaped by a drafter/adapter config (hidden, intermediate, heads, head_dim, eps, bias,
        and the drafter's ``qk_norm`` / ``context_input_norm`` where the config has them)."""
        return cls(
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.attention_bias,
            qk_norm=getattr(config, "qk_norm", False),
            context_input_norm=getattr(config, "context_input_norm", True),
        )

    def context_kv(self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Keys/values this layer exposes for (already projected) context features."""
        x = self.input_layernorm(context) if self.context_input_norm else context
        return self.self_attn.project_kv(x, cos, sin)

    def forward(self, x, cos, sin, mask, prefix_kv=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, prefix_kv)
        return x + self.mlp(self.post_attention_layernorm(x))
