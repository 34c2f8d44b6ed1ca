"""The drafter alone: how many tokens it commits per verification round (tau) on a set of items."""

from __future__ import annotations

import torch


def acceptance_on_items(target, drafter, items, max_new_tokens: int, references: dict | None = None, **options) -> dict:
    """Greedy tau of ``drafter`` (with drafting ``options``) over ``items``; outputs checked against AR.

    ``references`` caches the target's own greedy outputs by item id across calls. No timing, so it
    may run on a busy machine. Rounds are chains (full blocks) unless ``options`` name a ``tree``:
    a drafter's saved options may ask for tree rounds, which commit more per round from the same
    weights and so are not what "the drafter alone" measures.

    ``position_acceptance``: per draft position, ``[reached, accepted]`` summed over the items
    (:meth:`~hf_jetspec.generation.stats.GenerationStats.position_acceptance`; chain rounds).

    ``divergent`` lists every item whose output differs from the target's own (bf16 near-ties):
    ``{"item", "reference", "output"}`` with the generated token ids of each, for
    :func:`hf_jetspec.tools.numerics.score_item_divergences` to score in fp32.
    """
    references = {} if references is None else references
    saved = drafter.drafting_config
    drafter.drafting_config = saved.replace(**({"tree": None} | options))
    committed = rounds = 0
    divergent = []
    positions: list[list[int]] = []  # per draft position: [reached, accepted], summed over the items
    try:
        for item_id, ids in items:
            mask = torch.ones_like(ids)
            with torch.no_grad():
                out = target.generate(ids, attention_mask=mask, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens)
                if item_id not in references:
                    references[item_id] = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens)
            ref = references[item_id]
            if not torch.equal(out, ref):
                n = ids.shape[-1]
                divergent.append({"item": item_id, "reference": ref[0, n:].tolist(), "output": out[0, n:].tolist()})
            committed += drafter.generation_stats.committed_tokens
            rounds += drafter.generation_stats.rounds
            for i, (reached, accepted) in enumerate(drafter.generation_stats.position_acceptance()):
                if i == len(positions):
                    positions.append([0, 0])
                positions[i][0] += reached
                positions[i][1] += accepted
    finally:
        drafter.drafting_config = saved
    return {"tau": committed / max(rounds, 1), "rounds": rounds, "exact": not divergent, "divergent": divergent,
            "position_acceptance": positions}
