"""Masked denoisers: the protocol, an adapter for transformers masked LMs, and AntiBERTy.

A denoiser is any callable ``denoiser(tokens: LongTensor[B, L], t: Tensor[B]) -> Tensor[B, L, V]``
giving, for each position, the probabilities of the V tokens given the current partially masked
state at model time t. Rows at unmasked positions are ignored; the mask id has probability 0.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import Protocol

import torch


class Denoiser(Protocol):
    def __call__(self, tokens: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...


class MaskedLMDenoiser:
    """Wrap a transformers ``AutoModelForMaskedLM`` as a denoiser.

    Args:
        model: the masked LM (time-independent: ``t`` is accepted and ignored).
        mask_id: the model's mask token id.
        allowed_token_ids: the tokens a position may take (default: every id except the special
            ones of ``tokenizer``, or every id except ``mask_id``); others get probability 0.
        tokenizer: used to find the special tokens when ``allowed_token_ids`` is not given.
        prefix_ids / suffix_ids: fixed tokens around the generated span (e.g. ``[CLS]`` / ``[SEP]``).
        temperature: softmax temperature of the model's logits.
    """

    def __init__(self, model, mask_id: int, allowed_token_ids=None, tokenizer=None, prefix_ids=(), suffix_ids=(), temperature: float = 1.0):
        self.model = model.eval()
        self.mask_id = int(mask_id)
        vocab = model.config.vocab_size
        if allowed_token_ids is None:
            special = set(getattr(tokenizer, "all_special_ids", []) or []) | {self.mask_id}
            allowed_token_ids = [i for i in range(vocab) if i not in special]
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[torch.as_tensor(list(allowed_token_ids), dtype=torch.long)] = True
        if allowed[self.mask_id]:
            raise ValueError("the mask id cannot be an allowed token")
        self.allowed = allowed
        self.prefix = torch.as_tensor(list(prefix_ids), dtype=torch.long)
        self.suffix = torch.as_tensor(list(suffix_ids), dtype=torch.long)
        self.temperature = float(temperature)

    @property
    def vocab_size(self) -> int:
        return self.allowed.numel()

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        device = next(self.model.parameters()).device
        parts = [self.prefix.expand(b, -1), tokens.cpu(), self.suffix.expand(b, -1)]
        ids = torch.cat(parts, dim=1).to(device)
        logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        logits = logits[:, self.prefix.numel() : self.prefix.numel() + tokens.shape[1]].float() / self.temperature
        logits = logits.masked_fill(~self.allowed.to(device), float("-inf"))
        return torch.softmax(logits, dim=-1).to(tokens.device)


def truncated_masked_lm(model, num_layers: int):
    """A cheaper draft: the same masked LM keeping only its first ``num_layers`` encoder layers
    (embeddings, those layers and the MLM head copied from ``model``)."""
    import copy

    total = model.config.num_hidden_layers
    if not 0 < num_layers <= total:
        raise ValueError(f"num_layers must be in 1..{total}, got {num_layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    draft = type(model)(config)
    missing, _ = draft.load_state_dict(model.state_dict(), strict=False)
    if missing:
        raise ValueError(f"cannot truncate {type(model).__name__}: missing {missing}")
    return draft.to(device=model.device, dtype=model.dtype).eval()


ANTIBERTY_PIP = "pip install --no-deps antiberty==0.1.3"


def load_antiberty(cache_dir: str | os.PathLike | None = None):
    """AntiBERTy (a protein masked LM, 8 layers, 25 tokens) from the ``antiberty`` package.

    The package ships the weights without a tokenizer folder; they are assembled (with the
    package's vocab) under ``cache_dir`` (default ``~/.cache/hf_jetspec/antiberty``).
    Returns ``(model, tokenizer)``; the mask id is ``tokenizer.mask_token_id`` (4).
    """
    from transformers import BertForMaskedLM, BertTokenizer
    from transformers.utils import logging

    spec = importlib.util.find_spec("antiberty")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"AntiBERTy needs the antiberty package (later versions ship no weights): {ANTIBERTY_PIP}")
    root = Path(list(spec.submodule_search_locations)[0]) / "trained_models"
    folder = Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "hf_jetspec" / "antiberty"
    if not (folder / "vocab.txt").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "pytorch_model.bin"):
            shutil.copy(root / "AntiBERTy_md_smooth" / name, folder / name)
        shutil.copy(root / "vocab.txt", folder / "vocab.txt")
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the pooler and species/chain heads are unused: not a problem
    try:
        model = BertForMaskedLM.from_pretrained(str(folder)).eval()
    finally:
        logging.set_verbosity(verbosity)
    tokenizer = BertTokenizer.from_pretrained(str(folder), do_lower_case=False)
    return model, tokenizer


def antiberty_denoiser(model, tokenizer, **kwargs) -> MaskedLMDenoiser:
    """AntiBERTy as a denoiser over the 20 amino acids, the span wrapped in [CLS] ... [SEP]."""
    return MaskedLMDenoiser(
        model,
        mask_id=tokenizer.mask_token_id,
        tokenizer=tokenizer,
        prefix_ids=[tokenizer.cls_token_id],
        suffix_ids=[tokenizer.sep_token_id],
        **kwargs,
    )
