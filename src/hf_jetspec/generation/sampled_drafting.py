"""Drafts sampled from the drafter's own distribution, for exact speculative sampling.

Under greedy decoding a draft is the drafter's argmax and verification keeps it while it equals the
target's argmax. Under sampling an argmax draft is a point mass ``q = delta_d``: the target accepts
``d`` with its own probability ``p(d)``, often 0.4-0.8 at temperature 0.7, so long accepted runs are
rare. Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) instead draws each draft token
from a proposal ``q`` and accepts it with probability ``min(1, p(x) / q(x))``, committing a draw of
the residual ``norm(max(p - q, 0))`` at the first rejection. A token is then accepted with
probability ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``, which for a calibrated drafter is well above
``p(argmax)`` wherever the target is uncertain.

**When it is exact.** Position ``i``'s committed token follows the target's law when, given
everything before it, its draft ``x_i`` was drawn from the very ``q_i`` that verification uses, and
both ``q_i`` and the decision to verify position ``i`` were fixed before ``x_i`` was drawn, from
inputs that hold neither ``x_i`` nor any later draft token. Here:

- the Jacobi passes (J0 and ``num_jacobi_passes`` refinements) run on argmax tokens exactly as
  under greedy decoding; the final pass's distributions ``q_1 .. q_gamma`` come from inputs of
  argmax tokens, noise and the n-gram seed only, never from a sampled token;
- the round policy chooses the source and the verify length from that pass's numbers (top-1
  probabilities, agreement), before any draw;
- only then is the block drawn, every ``x_i ~ q_i`` in one go, with the global random stream (the one
  the user seeds and transformers verifies with), never with a fixed-seed generator: a seeded draw
  would be the same every call, a point mass that ``min(1, p/q)`` would misjudge.

This holds for causal and bidirectional drafters alike, for J0-only drafting and any number of
passes, for the foresight engine's pre-drafted blocks (their logits come from a pass over argmax
tokens), and for tree rounds (:mod:`hf_jetspec.generation.tree`, multi-draft rejection). Refining a block
*after* drawing it and verifying with the refined ``q`` would not be exact, and nothing here does it.
n-gram proposals and argmax drafts stay point masses (``q = delta_d``). Under sampling they are
handed to the verifier as point-mass logits (:func:`point_mass_logits`), so every sampled chain round
goes through one verifier, :func:`speculative_verify`: for a point mass it is exact match's law, and
it draws from one row of the target's distribution instead of from every row of the block.

**How q is shaped.** Any ``q`` is exact as long as the draft is drawn from it; a ``q`` shaped like
the target's processed ``p`` accepts more. The drafter's logits, scaled by
``DraftingConfig.proposal_sharpness`` (a drafter trained on other text is flatter than its target;
``benchmarks/proposal_shape.py`` measures the acceptance of each sharpness exactly), are shaped by
the target's own logits processors. Temperature, top-k, top-p and min-p read no token ids, so they
are applied here directly to the draft vocabulary's logits (a restricted draft head has a few
thousand columns, the target's vocabulary tens of thousands, and sorting for top-p is the largest
cost of a sampled round); top-p keeps the smallest set of most likely tokens whose mass reaches
``p``, found among the top 256 where it lies there. Any other processor (repetition penalty, ...)
sends the block the general way: the logits placed in the target's vocabulary (``-inf`` outside
the draft vocabulary) through the whole processor list, all rows in one batched call with the
verified sequence as their input ids, so such processors see the sequence before the block, not
the draft tokens before each position: a slightly different ``q``, still exact. Draws use one
uniform per row against the row's cumulative distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

_TOP_P_PREFIX = 256  # top-p looks for its nucleus among this many most likely tokens before sorting a whole row


@dataclass
class Proposal:
    """The proposal ``q`` of a drafted block: processed logits over its columns and the target id of
    each column (``vocab``; None: the columns are the target's ids)."""

    logits: torch.Tensor  # [g, C] float32 (-inf: no mass)
    vocab: torch.Tensor | None
    vocab_size: int

    @classmethod
    def from_probs(cls, probs: torch.Tensor) -> "Proposal":
        """A proposal over the target's own ids from probabilities [g, V]."""
        return cls(torch.log(probs.float()), None, probs.shape[-1])

    def __len__(self) -> int:
        return self.logits.shape[0]

    @property
    def probs(self) -> torch.Tensor:
        return torch.softmax(self.logits, dim=-1)

    def usable_rows(self) -> int:
        """Leading rows that define a distribution (some finite logit). A row the processors emptied
        (every allowed id outside the draft vocabulary) ends the block there."""
        ok = torch.isfinite(self.logits).any(-1)
        bad = (~ok).nonzero()
        return int(bad[0]) if bad.numel() else len(self)

    def truncate(self, n: int) -> "Proposal":
        return Proposal(self.logits[:n], self.vocab, self.vocab_size)

    def ids(self, columns: torch.Tensor) -> torch.Tensor:
        """Column indices -> target token ids."""
        return columns if self.vocab is None else self.vocab.to(columns.device)[columns]

    def top1(self) -> torch.Tensor:
        """Top-1 probability of each row [g] (the round policy's feature under sampling)."""
        return self.probs.amax(-1)

    def topk(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row the ``k`` most likely target ids and their probabilities ([g, k] each)."""
        probs, cols = self.probs.topk(min(k, self.logits.shape[-1]), dim=-1)
        return self.ids(cols), probs

    def sample(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """One draw per row (``rows``: row indices, repeats allowed; default every row) from the
        global random stream: a uniform against the row's cumulative distribution. Target ids [n]."""
        probs = self.probs if rows is None else self.probs[rows]
        return self.ids(draw_rows(probs))

    def dense_probs(self) -> torch.Tensor:
        """``q`` over the target's vocabulary [g, V]."""
        return self.probs if self.vocab is None else self._dense(self.probs, 0.0)

    def dense_logits(self) -> torch.Tensor:
        """Logits of ``q`` over the target's vocabulary [g, V] (-inf outside the draft vocabulary):
        what transformers' verifier reads as the candidate logits."""
        return self.logits if self.vocab is None else self._dense(self.logits, float("-inf"))

    def _dense(self, values: torch.Tensor, fill: float) -> torch.Tensor:
        out = values.new_full((values.shape[0], self.vocab_size), fill)
        out[:, self.vocab.to(values.device)] = values
        return out


def draw_rows(probs: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One column per row of ``probs`` [n, V] (unnormalised weights are fine): the first column whose
    cumulative weight exceeds ``u * total``, ``u`` uniform on [0, 1) from the global random stream
    (or ``uniforms`` [n]). A column of zero weight is never drawn."""
    if probs.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=probs.device)
    cum = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], dtype=torch.float64, device=probs.device) if uniforms is None else uniforms.double()
    cols = torch.searchsorted(cum, (u[:, None] * cum[:, -1:]), right=True)
    return cols.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


def point_mass_logits(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Candidate logits [1, L, V] of point masses on ``tokens`` [L]: 0 at each token, -inf elsewhere.

    Verified with ``min(1, p/q)``, a point mass ``q = delta_d`` is accepted with probability
    ``p(d)`` and a rejection commits a draw of ``norm(max(p - delta_d, 0))``, which is ``p`` without
    ``d``: the law of exact-match verification (sample the target at every position, keep the draft
    while they agree). Verification then draws from one row, where exact match draws from every row
    of the block (each a pass over the whole vocabulary)."""
    out = torch.full((1, tokens.numel(), vocab_size), float("-inf"), dtype=torch.float32, device=tokens.device)
    out[0, torch.arange(tokens.numel(), device=tokens.device), tokens.long()] = 0.0
    return out


def speculative_verify(drafts: torch.Tensor, q_logits: torch.Tensor, p_logits: torch.Tensor,
                       uniforms: torch.Tensor | None = None, point_masses: bool = False,
                       process_row: Callable[[int], None] | None = None) -> tuple[torch.Tensor, int]:
    """Verify drafts ``[L]`` drawn from ``q`` (logits ``[L, V]``) against the target's processed logits
    ``[L + 1, V]`` (speculative sampling, Leviathan et al. 2023, Algorithm 1). Returns the committed
    tokens ``[n + 1]`` (the ``n`` accepted drafts, then one draw of the residual at the first
    rejection, or of ``p`` after the last draft) and ``n``.

    Draft ``i`` is accepted iff ``u_i < p_i(x_i) / q_i(x_i)`` with ``u_i`` uniform on [0, 1) (float64,
    from the global random stream, or ``uniforms`` ``[L + 1]``, the last one for the committed draw).
    The strict inequality never accepts a token the target gives probability 0 (transformers' verifier
    compares with ``<=`` and accepts one when a float32 uniform is exactly 0, once in 2**24).
    ``point_masses=True`` says ``q_logits`` are :func:`point_mass_logits` of ``drafts``: then
    ``q_i(x_i) = 1`` and the residual is ``p`` without ``x_i``, and ``q_logits`` are not read. Rows
    after the first rejection are never normalised. ``process_row(i)``, when given, is called once
    before row ``i`` of ``p_logits`` is first read and may write that row in place (the target's
    logits processors applied only to the rows verification reads)."""
    length = drafts.numel()
    device = p_logits.device
    d = drafts.to(device).long()
    if uniforms is None:
        uniforms = torch.rand(length + 1, dtype=torch.float64, device=device)
    uniforms = uniforms.double()

    def p_row(i: int) -> torch.Tensor:
        if process_row is not None:
            process_row(i)
        return p_logits[i].float()

    # row by row, stopping at the first rejection: the rows after it are never processed nor normalised
    q_rows = None if point_masses else q_logits.float()
    n = 0
    while n < length:
        row = p_row(n)
        p_d = (row[d[n]] - torch.logsumexp(row, dim=-1)).double().exp()
        q_d = 1.0 if point_masses else (q_rows[n, d[n]] - torch.logsumexp(q_rows[n], dim=-1)).double().exp()
        if not (q_d > 0 and bool(uniforms[n] < p_d / q_d)):
            break
        n += 1
    last = torch.softmax(row if n < length else p_row(n), dim=-1)
    if n < length and point_masses:
        last[d[n]] = 0.0  # max(p - delta_d, 0)
    elif n < length:
        last = torch.clamp(last - torch.softmax(q_rows[n], dim=-1), min=0)
    t = draw_rows(last[None], uniforms[length:length + 1])
    return torch.cat([d[:n], t]), n


def full_vocab_logits(logits: torch.Tensor, draft_vocab: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits [..., V_draft] -> float32 logits over the target's vocabulary [..., V],
    ``-inf`` at ids outside the draft vocabulary (``draft_vocab``: the target id of each draft row;
    None: the draft vocabulary is the target's)."""
    logits = logits.float()
    if draft_vocab is None:
        if logits.shape[-1] != vocab_size:
            raise ValueError(f"draft logits have {logits.shape[-1]} columns, the target's vocabulary {vocab_size}")
        return logits
    out = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
    out[..., draft_vocab.to(logits.device)] = logits
    return out


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep, per row, the smallest set of most likely tokens whose probability reaches ``top_p`` (at
    least one); -inf elsewhere. The set is looked for among the top 256 first, and a row is sorted
    whole only where it is not there."""
    if top_p >= 1.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    k = min(_TOP_P_PREFIX, logits.shape[-1])
    if not bool((probs.topk(k, dim=-1).values.sum(-1) >= top_p).all()):
        k = logits.shape[-1]
    vals, cols = probs.topk(k, dim=-1)
    keep = (vals.cumsum(-1) - vals) < top_p  # the mass before each token is short of top_p
    out = torch.full_like(logits, float("-inf"))
    return out.scatter_(-1, cols, torch.where(keep, logits.gather(-1, cols), out[:, :k]))


# Processors whose output for a row depends only on that row and its input ids (no state kept between
# calls, no user callback): applying them to fewer rows cannot change what they return for the others.
_ROW_PURE_PROCESSORS = (
    "EncoderNoRepeatNGramLogitsProcessor", "EncoderRepetitionPenaltyLogitsProcessor", "EpsilonLogitsWarper",
    "EtaLogitsWarper", "ExponentialDecayLengthPenalty", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "InfNanRemoveLogitsProcessor", "LogitNormalization", "MinLengthLogitsProcessor", "MinNewTokensLengthLogitsProcessor",
    "MinPLogitsWarper", "NoBadWordsLogitsProcessor", "NoRepeatNGramLogitsProcessor", "RepetitionPenaltyLogitsProcessor",
    "SequenceBiasLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor", "SuppressTokensLogitsProcessor",
    "TemperatureLogitsWarper", "TopHLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "TypicalLogitsWarper",
)


def row_pure(logits_processor) -> bool:
    """Whether every processor of the list is one of transformers' own that reads only the row it
    processes and its input ids. Such a list may be applied lazily, to the rows verification reads;
    any other (a user's processor, classifier-free guidance with its own model cache, watermarks) is
    applied to every row as transformers does."""
    from transformers.generation import logits_process

    for proc in logits_processor or []:
        name = type(proc).__name__
        if name not in _ROW_PURE_PROCESSORS or type(proc) is not getattr(logits_process, name, None):
            return False
    return True


def _direct_warpers(logits_processor) -> list | None:
    """The processors as (kind, value) steps when each is a warper that reads no token ids, else None."""
    from transformers.generation.logits_process import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    steps = []
    for proc in logits_processor or []:
        if type(proc) is TemperatureLogitsWarper:
            steps.append(("temperature", float(proc.temperature)))
        elif type(proc) is TopKLogitsWarper:
            steps.append(("top_k", int(proc.top_k)))
        elif type(proc) is TopPLogitsWarper:
            steps.append(("top_p", float(proc.top_p)))
        elif type(proc) is MinPLogitsWarper:
            steps.append(("min_p", float(proc.min_p)))
        else:
            return None
    return steps


def make_proposal(draft_logits: torch.Tensor, draft_vocab: torch.Tensor | None, vocab_size: int, prefix_ids: torch.Tensor,
                  logits_processor=None, sharpness: float = 1.0) -> Proposal:
    """The proposal of a drafted block from its final pass's draft-vocabulary logits [g, V_draft]:
    scaled by ``sharpness`` (1: the drafter's own distribution; larger: sharper), then shaped by the
    target's ``logits_processor`` (see the module docstring for the two ways)."""
    x = draft_logits.float()
    if sharpness != 1.0:
        x = x * sharpness
    steps = _direct_warpers(logits_processor)
    if steps is None:  # processors that read token ids: the whole list over the target's vocabulary
        full = full_vocab_logits(x, draft_vocab, vocab_size)
        return Proposal(logits_processor(prefix_ids.expand(full.shape[0], -1), full.clone()), None, vocab_size)
    for kind, value in steps:
        if kind == "temperature":
            x = x / value
        elif kind == "top_k" and value < x.shape[-1]:
            kth = x.topk(value, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        elif kind == "top_p":
            x = top_p_filter(x, value)
        elif kind == "min_p":
            probs = torch.softmax(x, dim=-1)
            x = x.masked_fill(probs < value * probs.amax(-1, keepdim=True), float("-inf"))
    return Proposal(x, draft_vocab, vocab_size)
