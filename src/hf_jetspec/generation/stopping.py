"""Stopping criteria at token granularity for block-wise decoding.

transformers' assisted decoding applies EOS and the length limit inside a block but evaluates any
other stopping criterion (``stop_strings``, custom ``StoppingCriteria``) only at the end of each
verification round, so it can run past the point where plain decoding stops, or miss a stop
string that ends inside a block. Plain decoding stops at the first length at which a criterion
fires; :func:`first_stop_length` finds that length so the output can be cut there. The committed
tokens before it are the target's own, so the cut output equals plain decoding's.
"""

from __future__ import annotations

import torch


def first_stop_length(sequences: torch.Tensor, prompt_length: int, criteria) -> int:
    """Smallest length ``L > prompt_length`` at which ``criteria(sequences[:, :L])`` fires, else the full length.

    ``criteria`` is a ``StoppingCriteriaList`` (or any callable ``(input_ids, scores) -> BoolTensor``),
    evaluated as plain decoding evaluates it after each new token (``scores=None``). Criteria must
    be functions of the tokens; ``MaxTimeCriteria`` (wall clock) is left out of the replay.
    """
    from transformers.generation.stopping_criteria import MaxTimeCriteria, StoppingCriteriaList

    if isinstance(criteria, StoppingCriteriaList):
        # a wall-clock limit cannot be replayed on prefixes after the fact: it already acted in the loop
        criteria = StoppingCriteriaList(c for c in criteria if not isinstance(c, MaxTimeCriteria))
    total = sequences.shape[1]
    for length in range(prompt_length + 1, total):
        if bool(criteria(sequences[:, :length], None).all()):
            return length
    return total


def truncate_generate_output(result, keep_length: int, prompt_length: int):
    """Cut a ``generate`` result (tensor or ``GenerateDecoderOnlyOutput``) to ``keep_length`` tokens."""
    if isinstance(result, torch.Tensor):
        return result[:, :keep_length]
    result.sequences = result.sequences[:, :keep_length]
    new_tokens = keep_length - prompt_length
    for name in ("scores", "logits", "attentions", "hidden_states"):
        value = getattr(result, name, None)
        if isinstance(value, tuple) and len(value) > new_tokens:
            setattr(result, name, value[:new_tokens])
    return result
