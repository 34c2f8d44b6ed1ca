"""Exactness outside fp32: the numerical noise of a target in a dtype, and divergences scored against it.

In fp32 speculative decoding reproduces plain greedy decoding token for token. In bf16 a 1-token step
and a multi-token verification forward round differently, so at a near-tie the two can pick different
argmaxes; from there the outputs differ. What can be checked is that every divergence is such a tie:

* :func:`logit_noise` measures the noise: per position, the largest absolute difference between the
  logits of 1-token steps and of ``block``-token forwards over the same text;
* ``tie_margin`` is a high quantile (99.9th percentile) of that noise (:func:`tie_margin_from_noise`);
* :func:`score_divergence` finds the first position where a method's output differs from plain
  decoding, runs the target in fp32 teacher-forced on plain decoding's prefix, and takes the logit
  margin between the two tokens. A margin within ``tie_margin`` is a numerical tie; a larger one is a
  bug until explained.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where two token lists differ (a shorter list differs where it ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tie_margin_from_noise(noise: torch.Tensor | list[float], quantile: float = 0.999) -> float:
    values = torch.as_tensor(noise, dtype=torch.float64).flatten()
    if values.numel() == 0:
        raise ValueError("no noise measurements")
    return float(torch.quantile(values, quantile))


@torch.no_grad()
def _stepwise_logits(target, ids: torch.Tensor, prompt_len: int, step: int) -> torch.Tensor:
    """Logits [n, V] predicting positions prompt_len+1 .. end, computed ``step`` tokens per forward after a prefill."""
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    out = target(input_ids=ids[:, :prompt_len], cache=cache, use_cache=True)
    rows = [out.logits[0, -1:].float()]
    for start in range(prompt_len, ids.shape[1] - 1, step):
        end = min(start + step, ids.shape[1] - 1)
        out = target(input_ids=ids[:, start:end], cache=cache, use_cache=True)
        rows.append(out.logits[0].float())
    return torch.cat(rows)


@torch.no_grad()
def logit_noise(target, ids: torch.Tensor, prompt_len: int, block: int = 16) -> torch.Tensor:
    """Per position after the prompt: ``max_v |logits_1-token-step - logits_block-forward|`` [n]."""
    one = _stepwise_logits(target, ids, prompt_len, 1)
    many = _stepwise_logits(target, ids, prompt_len, block)
    return (one - many).abs().amax(-1)


@dataclass
class Divergence:
    """The first divergence of a method's output from plain decoding on one prompt."""

    prompt_index: int | str  # or the item id
    position: int
    ar_token: int | None
    method_token: int | None
    fp32_margin: float | None  # fp32 logit(AR token) - logit(method token), teacher-forced on AR's prefix

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def score_divergence(reference_target, prompt_ids: torch.Tensor, ar_tokens: list[int], method_tokens: list[int], prompt_index: int) -> Divergence | None:
    """Score the first divergence of ``method_tokens`` from ``ar_tokens`` with ``reference_target`` (fp32)."""
    pos = first_divergence(ar_tokens, method_tokens)
    if pos is None:
        return None
    a = ar_tokens[pos] if pos < len(ar_tokens) else None
    m = method_tokens[pos] if pos < len(method_tokens) else None
    margin = None
    if a is not None and m is not None:
        prefix = torch.tensor([ar_tokens[:pos]], dtype=prompt_ids.dtype)
        ids = torch.cat([prompt_ids.reshape(1, -1).cpu(), prefix], dim=-1).to(reference_target.device)
        logits = reference_target(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
        margin = float(logits[a] - logits[m])
    return Divergence(prompt_index, pos, a, m, margin)


def tie_explained(divergences: list[Divergence], tie_margin: float) -> float:
    """Share of divergent prompts whose fp32 margin is within ``tie_margin`` (1.0 when none diverge)."""
    if not divergences:
        return 1.0
    ok = sum(1 for d in divergences if d.fp32_margin is not None and abs(d.fp32_margin) <= tie_margin)
    return ok / len(divergences)


def score_item_divergences(reference_target, items, divergent: list[dict], tie_margin: float) -> dict:
    """Score the divergences :func:`~hf_jetspec.training.drafter_tau.acceptance_on_items` reports.

    ``items``: the ``(item_id, prompt_ids)`` pairs it ran; ``divergent``: its ``divergent`` list;
    ``reference_target``: the target in fp32. Returns ``{"divergences": [...], "tie_margin",
    "tie_explained"}``: each first divergence with its fp32 margin, and the share within ``tie_margin``
    (1.0 when nothing diverged)."""
    prompts = dict(items)
    scored = []
    for d in divergent:
        found = score_divergence(reference_target, prompts[d["item"]], d["reference"], d["output"], d["item"])
        if found is not None:
            scored.append(found)
    return {"divergences": [d.to_dict() for d in scored], "tie_margin": float(tie_margin),
            "tie_explained": tie_explained(scored, tie_margin)}


@torch.no_grad()
def teacher_forced_gaps(target, prompt_ids: torch.Tensor, output_tokens: list[int]) -> torch.Tensor:
    """Per output token: the target's max logit minus the logit of the committed token, teacher-forced [n].

    0 where the committed token is the target's argmax; a committed token that is only a numerical tie
    with the argmax has a gap within the tie margin.
    """
    ids = torch.cat([prompt_ids.reshape(1, -1).cpu(), torch.tensor([output_tokens], dtype=prompt_ids.dtype)], dim=-1)
    logits = target(input_ids=ids.to(target.device)).logits[0, prompt_ids.numel() - 1 : -1].float()
    chosen = logits.gather(-1, torch.tensor(output_tokens, device=logits.device)[:, None]).squeeze(-1)
    return logits.amax(-1) - chosen


class _Fp32(nn.Module):
    """An fp32 copy of a module that upcasts its input (the final norm and the LM head)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(module).float()

    @property
    def weight(self):
        return self.inner.weight

    def forward(self, x):
        return self.inner(x.float())


def upcast_head(target) -> None:
    """Compute ``target``'s final norm and LM head in fp32 (the decoder layers keep their dtype).

    Logits then carry fp32 resolution instead of bf16's coarse steps, for plain decoding and
    verification alike. The head is copied (tied embeddings stay as they are for the input side).
    """
    from ..drafter.target_info import target_backbone

    base = target_backbone(target)
    if not isinstance(base.norm, _Fp32):
        base.norm = _Fp32(base.norm)
    head = target.get_output_embeddings()
    if not isinstance(head, _Fp32):
        target.set_output_embeddings(_Fp32(head))
