"""Calibrated outcome scores (seed 000, Appendix B.1-B.2).

The served rule scores an outcome (k, a) by ``P_tilde(k) * P_beta(a | k)``:

* ``P_tilde(k)`` replaces each factor ``p_hat_i`` of Eq. 6 by ``p_tilde_i = sigmoid(w . phi_i)``,
  a logistic function of six features of position i (:func:`position_features`);
* ``P_beta(a | k) ~ p_hat(a | k) ** (1 / beta)`` renormalised over the decoder's top candidates at
  row k (32 by default) with ``d_{k+1}`` removed when k < gamma.

``w`` is fitted by maximum likelihood of the realised k, ``beta`` by maximum likelihood of the
realised anchor, and a split-conformal threshold on the calibrated score by the realised outcomes'
scores; all on rounds recorded from held-out calibration prompts. The fit is a small JSON file
(``foresight_calibration.json``) next to the drafter.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import torch

from .outcomes import TopRows, length_probs, rank_outcomes

CALIBRATION_NAME = "foresight_calibration.json"
FEATURE_NAMES = ("draft_top1_logit", "decoder_draft_logit", "draft_is_decoder_top", "decoder_alt_logit", "position", "bias")


def safe_logit(p: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    p = p.clamp(eps, 1 - eps)
    return torch.log(p) - torch.log1p(-p)


def position_features(
    draft_top1_prob: torch.Tensor,
    decoder_draft_prob: torch.Tensor,
    draft_is_decoder_top: torch.Tensor,
    decoder_alt_prob: torch.Tensor,
    position_scale: float = 14.0,
) -> torch.Tensor:
    """The six features ``phi_i`` of draft positions i = 1..gamma, as a [..., gamma, 6] tensor.

    Args:
        draft_top1_prob: the draft model's top-1 probability at position i in its final pass.
        decoder_draft_prob: ``p_hat_i``, the decoder's probability of ``d_i``.
        draft_is_decoder_top: whether ``d_i`` is the decoder's most likely token at i.
        decoder_alt_prob: ``max_{a != d_i} p_hat(a | i-1) / (1 - p_hat_i)``.
        position_scale: positions enter as ``i / position_scale`` (the seed uses 14).
    """
    gamma = draft_top1_prob.shape[-1]
    pos = torch.arange(1, gamma + 1, dtype=torch.float32, device=draft_top1_prob.device) / position_scale
    pos = pos.expand_as(draft_top1_prob)
    return torch.stack(
        [
            safe_logit(draft_top1_prob.float()),
            safe_logit(decoder_draft_prob.float()),
            draft_is_decoder_top.float(),
            safe_logit(decoder_alt_prob.float()),
            pos,
            torch.ones_like(pos),
        ],
        dim=-1,
    )


def decoder_position_stats(rows: "TopRows | torch.Tensor", draft: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From decoder rows (sparse :class:`TopRows`, or dense [gamma+1, V]) and the draft [gamma]:
    ``p_hat_i``, top-token flag, alt prob ``max_{a != d_i} p_hat(a | i-1) / (1 - p_hat_i)``."""
    if isinstance(rows, torch.Tensor):
        rows = TopRows.from_probs(rows, draft, top=2)
    gamma = draft.shape[-1]
    draft = draft.to(rows.ids.device)
    p_hat = rows.draft_probs[:gamma]
    is_top = rows.ids[:gamma, 0] == draft
    best_other = torch.where(is_top, rows.probs[:gamma, 1], rows.probs[:gamma, 0])
    alt = best_other / (1 - p_hat).clamp(min=1e-12)
    return p_hat, is_top, alt.clamp(max=1.0)


def anchor_candidates_top(ids: torch.Tensor, probs: torch.Tensor, excluded: int | None, beta: float = 1.0, top: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``P_beta(a | k)`` over one row's most likely tokens ``ids`` (probabilities ``probs``, most likely
    first), ``excluded`` removed and zero-probability tokens dropped, keeping the first ``top``.

    Returns ``(tokens [m], probs [m])`` sorted by probability; probs sum to 1.
    """
    keep = probs > 0
    if excluded is not None:
        keep &= ids != excluded
    toks, vals = ids[keep][:top], probs[keep][:top].float()
    logp = torch.log(vals.clamp(min=1e-30)) / beta
    return toks, torch.softmax(logp, dim=-1)


def anchor_candidates(
    bonus_row: torch.Tensor, excluded: int | None, beta: float = 1.0, top: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`anchor_candidates_top` of a dense row [V]."""
    vals, toks = torch.sort(bonus_row.float(), descending=True, stable=True)
    return anchor_candidates_top(toks, vals, excluded, beta, top)


@dataclass
class ForesightCalibration:
    """The fitted served rule: feature weights ``w``, anchor temperature ``beta``, conformal threshold."""

    weights: list[float] = field(default_factory=lambda: [0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    beta: float = 1.0
    threshold: float | None = None
    coverage: float | None = None
    top_candidates: int = 32
    position_scale: float = 14.0
    num_rounds: int = 0
    budget: int | None = None

    def accept_probs(self, features: torch.Tensor) -> torch.Tensor:
        """``p_tilde_i = sigmoid(w . phi_i)`` for features [..., gamma, 6]."""
        w = torch.tensor(self.weights, dtype=torch.float32, device=features.device)
        return torch.sigmoid(features.float() @ w)

    def length_probs(self, features: torch.Tensor) -> torch.Tensor:
        """``P_tilde(k)``, k = 0..gamma."""
        return length_probs(self.accept_probs(features))

    def scored_outcomes(self, features: torch.Tensor, rows: "TopRows | torch.Tensor", draft: torch.Tensor) -> list[tuple[float, int, int]]:
        """Every candidate outcome with its calibrated score: a list of ``(score, k, a)``. ``rows`` are the
        decoder's (sparse :class:`TopRows` keeping at least ``top_candidates + 1`` tokens, or dense)."""
        if isinstance(rows, torch.Tensor):
            rows = TopRows.from_probs(rows, draft, self.top_candidates + 1)
        pk = self.length_probs(features)
        gamma = draft.shape[-1]
        out = []
        for k in range(gamma + 1):
            excluded = int(draft[k]) if k < gamma else None
            toks, probs = anchor_candidates_top(rows.ids[k], rows.probs[k], excluded, self.beta, self.top_candidates)
            for t, p in zip(toks.tolist(), (probs * pk[k]).tolist()):
                out.append((p, k, t))
        return out

    def select(self, features: torch.Tensor, rows: "TopRows | torch.Tensor", draft: torch.Tensor, cache_size: int, conformal: bool = False) -> list[tuple[int, int]]:
        """The outcomes to pre-draft: the ``cache_size`` best, or the conformal set capped at it."""
        threshold = self.threshold if conformal else None
        return rank_outcomes(self.scored_outcomes(features, rows, draft), cache_size, threshold)

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike) -> str:
        path = os.path.join(directory, CALIBRATION_NAME)
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self) | {"feature_names": list(FEATURE_NAMES)}, f, indent=2)
            f.write("\n")
        return path

    @classmethod
    def load(cls, directory_or_file: str | os.PathLike) -> "ForesightCalibration":
        path = directory_or_file
        if os.path.isdir(path):
            path = os.path.join(path, CALIBRATION_NAME)
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); re-run `hf-jetspec calibrate`") from e
        names = data.pop("feature_names", list(FEATURE_NAMES))
        if list(names) != list(FEATURE_NAMES):
            raise ValueError(f"{path} was fitted on features {names}, this version uses {list(FEATURE_NAMES)}")
        known = {f.name for f in dataclasses.fields(cls)}
        cal = cls(**{k: v for k, v in data.items() if k in known})
        if len(cal.weights) != len(FEATURE_NAMES):
            raise ValueError(f"{path}: expected {len(FEATURE_NAMES)} weights, got {len(cal.weights)}")
        return cal


# ---------------------------------------------------------------------- fitting
def fit_anchor_temperature(candidate_logprobs: list[torch.Tensor], realized_index: list[int], grid: torch.Tensor | None = None) -> float:
    """Maximum-likelihood ``beta`` of the realised anchors.

    ``candidate_logprobs[r]``: the decoder's log-probabilities of the candidates of round r at its
    realised k (d_{k+1} removed); ``realized_index[r]``: the position of the realised anchor among
    them (rounds whose anchor is not a candidate are left out by the caller).
    """
    if not candidate_logprobs:
        return 1.0
    grid = torch.exp(torch.linspace(math.log(0.05), math.log(20.0), 241)) if grid is None else grid
    best, best_ll = 1.0, -float("inf")
    for beta in grid.tolist():
        ll = sum(float(torch.log_softmax(lp.double() / beta, -1)[i]) for lp, i in zip(candidate_logprobs, realized_index))
        if ll > best_ll:
            best, best_ll = beta, ll
    return best


def conformal_threshold(realized_scores: torch.Tensor | list[float], miscoverage: float) -> float:
    """Split-conformal threshold: the largest lambda with ``P(score(o*) >= lambda) >= 1 - miscoverage``.

    ``realized_scores`` are the calibrated scores of the realised outcomes on calibration rounds
    (0 when the realised outcome was not among the candidates). Returns the
    ``floor(miscoverage * (n + 1))``-th smallest score (0 when that index is 0).
    """
    s = torch.sort(torch.as_tensor(realized_scores, dtype=torch.float64)).values
    n = s.numel()
    if not 0 < miscoverage < 1:
        raise ValueError("miscoverage must be in (0, 1)")
    idx = math.floor(miscoverage * (n + 1))
    return 0.0 if idx < 1 else float(s[min(idx, n) - 1])
