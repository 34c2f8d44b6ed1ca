"""Per-position acceptance estimates for a drafted block, and their calibration.

The drafter already computes what predicts acceptance: at block position ``i`` (draft token ``i``,
1-based) its top-1 probability in the final pass, whether the final pass agreed with the token the
position held before it (the previous Jacobi pass or the n-gram seed), and the position itself.
``p_i = sigmoid(w . phi_i)`` with

    phi_i = [logit(top-1 prob), agreed, log(i), 1]

is fitted by maximum likelihood of the realised accepted lengths on rounds recorded from held-out
prompts (``hf-jetspec calibrate-policy``), and stored beside the drafter as
``acceptance_calibration.json``. Without a fit, the raw top-1 probabilities are used.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import torch

from .length_likelihood import fit_feature_weights, length_log_likelihood

ACCEPTANCE_CALIBRATION_NAME = "acceptance_calibration.json"
SAMPLED_ACCEPTANCE_CALIBRATION_NAME = "acceptance_calibration_sampled.json"  # fitted on rounds with drafts drawn from q
FEATURE_NAMES = ("draft_top1_logit", "agreed", "log_position", "bias")


def acceptance_features(top1_prob: torch.Tensor, agreed: torch.Tensor) -> torch.Tensor:
    """Features ``phi_i`` [..., gamma, 4] of draft positions ``i = 1..gamma``."""
    gamma = top1_prob.shape[-1]
    p = top1_prob.float().clamp(1e-6, 1 - 1e-6)
    log_pos = torch.log(torch.arange(1, gamma + 1, dtype=torch.float32, device=p.device)).expand_as(p)
    return torch.stack([torch.log(p) - torch.log1p(-p), agreed.float(), log_pos, torch.ones_like(p)], dim=-1)


def node_features(topk_probs: torch.Tensor, agreed: torch.Tensor) -> torch.Tensor:
    """Features [D, K, 4] of every tree candidate: rank ``r`` at depth ``d`` (1-based) scores with its
    own draft probability ``topk_probs[d-1, r]``, at depth ``d``; only the top-1 candidate can have
    ``agreed`` (``agreed[d-1]``: the final pass kept the token the position held before it)."""
    depth, k = topk_probs.shape
    flags = torch.zeros(k, depth, dtype=torch.bool)
    flags[0] = agreed.reshape(-1).cpu().bool()
    return acceptance_features(topk_probs.float().cpu().T, flags).transpose(0, 1)


@dataclass
class AcceptanceModel:
    """Calibrated conditional acceptance probabilities of drafted positions."""

    weights: list[float] | None = None
    num_rounds: int = 0
    num_jacobi_passes: int | None = None
    budget: int | None = None
    held_out_log_likelihood: float | None = None
    raw_log_likelihood: float | None = None
    prompts: list[str] = field(default_factory=list)
    temperature: float = 0.0  # the sampling temperature of the recorded rounds (0: greedy)
    top_p: float = 1.0

    @property
    def calibrated(self) -> bool:
        return self.weights is not None

    def accept_probs(self, features: torch.Tensor) -> torch.Tensor:
        """``p_i`` for features [..., gamma, 4]; the raw top-1 probability when uncalibrated."""
        if self.weights is None:
            return torch.sigmoid(features[..., 0].float())
        w = torch.tensor(self.weights, dtype=torch.float32, device=features.device)
        return torch.sigmoid(features.float() @ w)

    @property
    def file_name(self) -> str:
        """Greedy fits and fits on sampled rounds are stored side by side, each in its own file."""
        return SAMPLED_ACCEPTANCE_CALIBRATION_NAME if self.temperature > 0 else ACCEPTANCE_CALIBRATION_NAME

    def save(self, directory: str | os.PathLike) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.file_name)
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self) | {"feature_names": list(FEATURE_NAMES)}, f, indent=2)
            f.write("\n")
        return path

    @classmethod
    def load(cls, directory_or_file: str | os.PathLike) -> "AcceptanceModel":
        path = str(directory_or_file)
        if os.path.isdir(path):
            path = os.path.join(path, ACCEPTANCE_CALIBRATION_NAME)
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err}); re-run hf-jetspec calibrate-policy") from err
        data.pop("feature_names", None)
        known = {f.name for f in dataclasses.fields(cls)}
        model = cls(**{k: v for k, v in data.items() if k in known})
        if model.weights is not None and (len(model.weights) != len(FEATURE_NAMES) or not all(math.isfinite(w) for w in model.weights)):
            raise ValueError(f"{path}: expected {len(FEATURE_NAMES)} finite weights, got {model.weights}")
        return model


@dataclass
class AcceptanceRecord:
    """One recorded round: features of its drafted positions and how many were accepted."""

    features: list[list[float]]
    accepted: int
    verified: int


def pad_records(records: list[AcceptanceRecord]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(features [R, G, F], realized_k [R], valid [R, G])`` with positions past each round's verified length masked."""
    gamma = max(len(r.features) for r in records)
    feats = torch.zeros(len(records), gamma, len(FEATURE_NAMES))
    valid = torch.zeros(len(records), gamma, dtype=torch.bool)
    for i, r in enumerate(records):
        n = min(len(r.features), r.verified)
        feats[i, : len(r.features)] = torch.tensor(r.features)
        valid[i, :n] = True
    return feats, torch.tensor([r.accepted for r in records]), valid


def fit_acceptance(train: list[AcceptanceRecord], held_out: list[AcceptanceRecord] | None = None, **meta) -> AcceptanceModel:
    """Fit ``w`` on ``train`` (maximum likelihood of the accepted lengths); report the mean held-out
    log-likelihood per round of the fit and of the raw probabilities."""
    if not train:
        raise ValueError("no recorded rounds to calibrate on")
    feats, k, valid = pad_records(train)
    model = AcceptanceModel(weights=fit_feature_weights(feats, k, valid), num_rounds=len(train), **meta)
    if held_out:
        hf, hk, hv = pad_records(held_out)
        n = len(held_out)
        model.held_out_log_likelihood = float(length_log_likelihood(model.accept_probs(hf), hk, hv)) / n
        model.raw_log_likelihood = float(length_log_likelihood(AcceptanceModel().accept_probs(hf), hk, hv)) / n
    return model
