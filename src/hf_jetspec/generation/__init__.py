"""The generation loop behind transformers' ``generate``: the seam, the candidate generator of chain
rounds, tree rounds, sampled drafts, stopping, verification attention and per-generation statistics."""
