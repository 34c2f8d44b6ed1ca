"""Tokenised training sequences from chat conversations."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def tokenize_chat(tokenizer, messages: list[dict], max_length: int) -> dict | None:
    """Token ids of a chat with the index where the (first) assistant response starts."""
    prompt = tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=True)
    full = tokenizer.apply_chat_template(messages[:2], tokenize=True)
    prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    full = full["input_ids"] if isinstance(full, dict) or hasattr(full, "keys") else full
    start = len(prompt)
    if full[:start] != list(prompt):
        return None
    ids = list(full)[:max_length]
    return {"input_ids": ids, "response_start": start}


def build_corpus(tokenizer, chats, max_length: int, min_response_tokens: int, limit: int | None = None, max_prompt_tokens: int | None = None) -> list[dict]:
    """Tokenise chats, keeping those with at least ``min_response_tokens`` response tokens in range."""
    out = []
    for messages in chats:
        item = tokenize_chat(tokenizer, messages, max_length)
        if item is None:
            continue
        if max_prompt_tokens is not None and item["response_start"] > max_prompt_tokens:
            continue
        if len(item["input_ids"]) - item["response_start"] < min_response_tokens:
            continue
        out.append(item)
        if limit is not None and len(out) >= limit:
            break
    return out


@dataclass
class CorpusCollator:
    """Right-pads sequences; passes ``response_start`` and ``length`` through."""

    pad_token_id: int

    def __call__(self, features: list[dict]) -> dict:
        lengths = [len(f["input_ids"]) for f in features]
        width = max(lengths)
        ids = torch.full((len(features), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, : lengths[i]] = torch.tensor(f["input_ids"], dtype=torch.long)
            mask[i, : lengths[i]] = 1
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "response_start": torch.tensor([f["response_start"] for f in features], dtype=torch.long),
            "length": torch.tensor(lengths, dtype=torch.long),
        }


def load_training_corpus(tokenizer, corpus: str = "sharegpt", num_sequences: int = 4000, seq_len: int = 384, seed: int = 0,
                         skip: int = 0, shuffle: bool = True) -> list[dict]:
    """Tokenised, shuffled training sequences from ShareGPT (``"sharegpt"``) or a local JSONL of chats.

    Each JSONL line holds ``{"messages": [...]}``. Sequences keep at most ``seq_len`` tokens, half
    of them prompt at most, and at least 64 response tokens. The first ``num_sequences`` that
    qualify are taken after skipping ``skip`` qualifying ones (so ``skip=N`` gives data disjoint
    from a corpus of ``num_sequences=N``), then shuffled with ``seed`` (``shuffle=False`` keeps the
    source order, so a larger ``num_sequences`` extends the same list: what a resumable feature
    cache needs).
    """
    import json
    import random

    from ..data import sharegpt_chats

    if corpus == "sharegpt":
        chats = sharegpt_chats()
    else:
        chats = (json.loads(line)["messages"] for line in open(corpus) if line.strip())
    out = build_corpus(tokenizer, chats, max_length=seq_len, min_response_tokens=64, limit=num_sequences + skip, max_prompt_tokens=seq_len // 2)[skip:]
    if shuffle:
        random.Random(seed).shuffle(out)
    return out
