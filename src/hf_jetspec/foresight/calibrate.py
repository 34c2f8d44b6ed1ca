"""Recording foresight rounds and fitting the served rule on them (seed 000, Appendix B.2)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable

import torch

from ..policy.length_likelihood import fit_feature_weights
from .calibration import ForesightCalibration, conformal_threshold, fit_anchor_temperature
from .engine import ForesightRecord
from .outcomes import TopRows


def record_rounds(target, assistant, items: Iterable[tuple[str, torch.Tensor]], max_new_tokens: int, cache_size: int = 4,
                  calibrated: bool = False, progress: bool = True) -> list[ForesightRecord]:
    """Serve ``items`` (``(id, prompt ids)``) greedily with foresight on and return every round's record.

    ``assistant`` is a :class:`~hf_jetspec.assistant.JetSpecAssistant` with a foresight adapter
    attached. Selection uses the attached calibration when ``calibrated`` (else Eq. 6's raw scores);
    the records themselves (decoder/draft rows, features, realised outcome) do not depend on the rule.
    """
    from tqdm.auto import tqdm

    saved_options = assistant.drafting_config
    adapter, calibration = assistant.foresight
    if not calibrated:
        assistant.foresight = (adapter, None)
    assistant.drafting_config = saved_options.replace(foresight=True, record_rounds=True, pipeline="off", cache_size=cache_size)
    records: list[ForesightRecord] = []
    try:
        items = list(items)
        for _, ids in tqdm(items, desc="recording rounds", disable=not progress):
            with torch.no_grad():
                target.generate(ids.to(target.device), attention_mask=torch.ones_like(ids).to(target.device), assistant_model=assistant,
                                do_sample=False, max_new_tokens=max_new_tokens)
            records.extend(assistant.generation_stats.foresight_records)
    finally:
        assistant.drafting_config = saved_options
        assistant.foresight = (adapter, calibration)
    return records


def _compact(obj):
    """Floats to 4 significant digits (records are large: two top-33 lists per block row)."""
    if isinstance(obj, float):
        return float(f"{obj:.4g}")
    if isinstance(obj, (list, tuple)):
        return [_compact(x) for x in obj]
    return obj


def save_records(records: list[ForesightRecord], path: str | os.PathLike) -> None:
    """One JSON object per round (floats kept to 4 significant digits)."""
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps({k: _compact(v) for k, v in dataclasses.asdict(r).items()}) + "\n")


def load_records(path: str | os.PathLike) -> list[ForesightRecord]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                d["selected"] = [tuple(x) for x in d.get("selected", [])]
                d["realized"] = None if d.get("realized") is None else tuple(d["realized"])
                out.append(ForesightRecord(**d))
    return out


def decoder_anchor_logprobs(record: ForesightRecord, k: int, top: int = 32) -> tuple[list[int], torch.Tensor]:
    """The decoder's candidate anchors at row k (``d_{k+1}`` removed) and their log-probabilities."""
    gamma = len(record.draft)
    excluded = record.draft[k] if k < gamma else None
    pairs = [(t, p) for t, p in zip(record.decoder_row_tokens[k], record.decoder_row_probs[k]) if t != excluded][:top]
    toks = [t for t, _ in pairs]
    return toks, torch.log(torch.tensor([p for _, p in pairs], dtype=torch.float64).clamp(min=1e-30))


def fit_calibration(records: list[ForesightRecord], miscoverage: float = 0.1, top: int = 32, budget: int | None = None) -> ForesightCalibration:
    """Fit ``w`` (realised lengths), ``beta`` (realised anchors) and the conformal threshold on ``records``."""
    done = [r for r in records if r.realized is not None and len(r.draft) > 0]
    if not done:
        raise ValueError("no completed foresight rounds to calibrate on: record more prompts or longer generations")
    gmax = max(len(r.draft) for r in done)
    feats = torch.zeros(len(done), gmax, 6, dtype=torch.float64)
    valid = torch.zeros(len(done), gmax, dtype=torch.bool)
    ks = torch.tensor([r.realized[0] for r in done])
    for i, r in enumerate(done):
        g = len(r.draft)
        feats[i, :g] = torch.tensor(r.features, dtype=torch.float64)
        valid[i, :g] = True
    weights = fit_feature_weights(feats, ks, valid)

    cands, idx = [], []
    for r in done:
        k, a = r.realized
        toks, logp = decoder_anchor_logprobs(r, k, top)
        if a in toks:
            cands.append(logp)
            idx.append(toks.index(a))
    beta = fit_anchor_temperature(cands, idx)
    cal = ForesightCalibration(weights=weights, beta=beta, top_candidates=top, num_rounds=len(done), budget=budget)
    scores = []
    for r in done:
        scored = {(k, a): p for p, k, a in calibrated_outcome_scores(cal, r)}
        scores.append(scored.get(tuple(r.realized), 0.0))
    cal.threshold = conformal_threshold(scores, miscoverage)
    cal.coverage = 1 - miscoverage
    return cal


def record_rows(record: ForesightRecord) -> TopRows:
    """The decoder rows of a recorded round (its kept top tokens per row and ``p_hat`` of the draft)."""
    return TopRows(
        torch.tensor(record.decoder_row_tokens, dtype=torch.long),
        torch.tensor(record.decoder_row_probs, dtype=torch.float32),
        torch.tensor(record.p_hat, dtype=torch.float32),
    )


def calibrated_outcome_scores(cal: ForesightCalibration, record: ForesightRecord) -> list[tuple[float, int, int]]:
    """Calibrated scores of every candidate outcome of a recorded round (the served rule, as served live)."""
    return cal.scored_outcomes(torch.tensor(record.features), record_rows(record), torch.tensor(record.draft))


__all__ = ["calibrated_outcome_scores", "fit_calibration", "load_records", "record_rounds", "save_records"]
