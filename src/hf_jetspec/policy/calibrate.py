"""Recording rounds and fitting the acceptance model (``hf-jetspec calibrate-policy``)."""

from __future__ import annotations

import torch

from .acceptance import AcceptanceModel, AcceptanceRecord, fit_acceptance


def record_acceptance(target, drafter, items, max_new_tokens: int, progress: bool = True, temperature: float = 0.0,
                      top_p: float = 1.0) -> list[list[AcceptanceRecord]]:
    """Per item, the acceptance records of generation with a full drafted block every round: greedy, or
    sampled at ``temperature`` / ``top_p`` (drafts drawn from q, features read from q)."""
    sample = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else dict(do_sample=False)
    from tqdm.auto import tqdm

    saved = drafter.drafting_config
    drafter.drafting_config = saved.replace(record_acceptance=True, policy=True)
    out = []
    try:
        for _, ids in tqdm(items, desc="recording rounds", disable=not progress):
            ids = ids.to(target.device)
            with torch.no_grad():
                target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, max_new_tokens=max_new_tokens, **sample)
            out.append(list(drafter.generation_stats.acceptance_records))
    finally:
        drafter.drafting_config = saved
    return out


def calibrate_acceptance(per_item: list[list[AcceptanceRecord]], held_out_fraction: float = 0.25, **meta) -> AcceptanceModel:
    """Fit on the first items, report the log-likelihood on the last ``held_out_fraction`` of them."""
    n_held = max(1, int(round(len(per_item) * held_out_fraction))) if len(per_item) > 1 else 0
    train = [r for item in per_item[: len(per_item) - n_held] for r in item]
    held = [r for item in per_item[len(per_item) - n_held :] for r in item]
    return fit_acceptance(train, held or None, **meta)
