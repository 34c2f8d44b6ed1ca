"""A bounded replay buffer of verified sequences, in the feature cache's item format.

Online learning (:mod:`hf_jetspec.training.online`) keeps what each ``generate`` call verified: the
committed tokens and the target's read-layer states at their positions, the very tensors an offline
:class:`~hf_jetspec.training.FeatureCacheDataset` item holds. The label at position ``t`` is the token
the target committed at ``t + 1`` (its argmax under greedy decoding, its sample under sampling), stored
as a top-1 distribution (the online learner replaces it by the target's recorded top-k distribution
where it has one, :func:`~hf_jetspec.training.online.with_soft_labels`), so the items train through
:class:`~hf_jetspec.training.JetSpecTrainer`'s cached-feature path unchanged.

The buffer is bounded in bytes: adding past ``max_bytes`` drops the oldest items first. An optional
*generic* pool, seeded from an offline feature cache and bounded separately, mixes a share of broad
data into every batch (:meth:`ReplayBuffer.sample`) as a guard against forgetting.
"""

from __future__ import annotations

import json
import os
from collections import deque

import torch
from safetensors.torch import load_file, save_file

from .losses import MISSING_LOGIT

BUFFER_INDEX = "replay_buffer.json"
BUFFER_WEIGHTS = "replay_buffer.safetensors"


def item_nbytes(item: dict) -> int:
    """Bytes held by one item's tensors."""
    return sum(t.numel() * t.element_size() for t in item.values() if isinstance(t, torch.Tensor))


def verified_item(tokens: torch.Tensor, states: torch.Tensor, response_start: int, states_dtype: torch.dtype = torch.bfloat16) -> dict:
    """A training item from one call: ``tokens`` [T] the whole committed sequence (prompt + output),
    ``states`` [S, n*H] the read-layer states of its first ``S <= T - 1`` positions (the last committed
    token was never run through the target). The item keeps the ``S`` positions with states; the
    label of position ``t`` is ``tokens[t + 1]``."""
    tokens = tokens.reshape(-1).long().cpu()
    n = states.shape[0]
    if n < 1 or n > tokens.numel() - 1:
        raise ValueError(f"{n} state rows for {tokens.numel()} tokens: need 1 .. {tokens.numel() - 1}")
    return {
        "input_ids": tokens[:n].clone(),
        "states": states.detach().to("cpu", states_dtype).contiguous(),
        "topk_ids": tokens[1 : n + 1, None].to(torch.int32).clone(),
        "topk_logprobs": torch.zeros(n, 1, dtype=torch.float16),
        "next_logprob": torch.zeros(n, dtype=torch.float32),
        "response_start": int(response_start),
    }


def match_top_k(items: list[dict]) -> list[dict]:
    """The items with their top-k label columns padded to the widest k of the batch (extra columns:
    id 0 at ``MISSING_LOGIT``, which the label construction ignores), so a collator can stack them."""
    k = max(int(it["topk_ids"].shape[1]) for it in items)
    out = []
    for it in items:
        pad = k - int(it["topk_ids"].shape[1])
        if pad:
            it = dict(it)
            n = it["topk_ids"].shape[0]
            it["topk_ids"] = torch.cat([it["topk_ids"], torch.zeros(n, pad, dtype=it["topk_ids"].dtype)], 1)
            it["topk_logprobs"] = torch.cat([it["topk_logprobs"], torch.full((n, pad), MISSING_LOGIT, dtype=it["topk_logprobs"].dtype)], 1)
        out.append(it)
    return out


class ReplayBuffer:
    """Verified sequences for online learning, oldest dropped first past ``max_bytes``.

    Args:
        layer_ids: the target layers the states were read at (a learner checks them against its drafter).
        hidden_size: the target's hidden size (states have ``len(layer_ids) * hidden_size`` columns).
        max_bytes: cap on the bytes of the verified items (default 64 MiB).
        generic_max_bytes: cap on the generic pool seeded by :meth:`seed_from` (default 32 MiB).
    """

    def __init__(self, layer_ids: list[int], hidden_size: int, max_bytes: int = 64 << 20, generic_max_bytes: int = 32 << 20):
        if max_bytes <= 0 or generic_max_bytes < 0:
            raise ValueError(f"max_bytes must be > 0 and generic_max_bytes >= 0, got {max_bytes}, {generic_max_bytes}")
        self.layer_ids = [int(i) for i in layer_ids]
        self.hidden_size = int(hidden_size)
        self.max_bytes = int(max_bytes)
        self.generic_max_bytes = int(generic_max_bytes)
        self.items: deque[dict] = deque()
        self.generic: list[dict] = []
        self.nbytes = 0
        self.peak_bytes = 0
        self.added = 0  # items ever added (dropped ones included)
        self.added_tokens = 0
        self.dropped = 0

    @classmethod
    def for_drafter(cls, drafter, **kwargs) -> "ReplayBuffer":
        c = drafter.config
        return cls(list(c.target_layer_ids), c.target_hidden_size, **kwargs)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def num_tokens(self) -> int:
        return sum(int(it["input_ids"].numel()) for it in self.items)

    def check_drafter(self, drafter) -> None:
        """A clear error when ``drafter`` reads other target layers or another hidden size."""
        c = drafter.config
        if list(c.target_layer_ids) != self.layer_ids or int(c.target_hidden_size) != self.hidden_size:
            raise ValueError(f"this replay buffer holds states of target layers {self.layer_ids} (hidden size {self.hidden_size}); "
                             f"the drafter reads layers {list(c.target_layer_ids)} (hidden size {c.target_hidden_size})")

    def _check_item(self, item: dict) -> None:
        width = len(self.layer_ids) * self.hidden_size
        if item["states"].shape[-1] != width:
            raise ValueError(f"an item with {item['states'].shape[-1]} state columns; this buffer holds {width} "
                             f"({len(self.layer_ids)} layers x {self.hidden_size})")

    def add(self, item: dict) -> bool:
        """Append ``item`` (see :func:`verified_item`) after dropping the oldest items it does not fit
        beside, so the buffer never holds more than ``max_bytes``; an item larger than the cap alone
        is not kept (returns False)."""
        self._check_item(item)
        size = item_nbytes(item)
        self.added += 1
        if size > self.max_bytes:
            self.dropped += 1
            return False
        while self.items and self.nbytes + size > self.max_bytes:
            self.nbytes -= item_nbytes(self.items.popleft())
            self.dropped += 1
        self.items.append(item)
        self.nbytes += size
        self.added_tokens += int(item["input_ids"].numel()) - int(item["response_start"])
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        return True

    def seed_from(self, dataset, max_items: int | None = None) -> int:
        """Fill the generic pool from an offline :class:`~hf_jetspec.training.FeatureCacheDataset` of the
        same read layers, up to ``generic_max_bytes`` (or ``max_items``); returns the items taken."""
        info = dataset.info
        if list(info.target_layer_ids) != self.layer_ids or int(info.target_hidden_size) != self.hidden_size:
            raise ValueError(f"the feature cache holds target layers {list(info.target_layer_ids)} (hidden {info.target_hidden_size}); "
                             f"this buffer holds {self.layer_ids} (hidden {self.hidden_size})")
        used = sum(item_nbytes(it) for it in self.generic)
        taken = 0
        for i in range(len(dataset)):
            if max_items is not None and taken >= max_items:
                break
            item = dataset[i]
            size = item_nbytes(item)
            if used + size > self.generic_max_bytes:
                break
            self.generic.append(item)
            used += size
            taken += 1
        return taken

    def sample(self, n: int, generator: torch.Generator, newest: int = 1, generic_share: float = 0.0) -> list[dict]:
        """``n`` items for one step: the ``newest`` most recent ones, then uniform draws from the
        buffer, and about ``generic_share`` of the batch from the generic pool (when it holds any)."""
        if not self.items:
            return []
        picked = list(self.items)[-min(newest, n, len(self.items)):] if newest > 0 else []
        while len(picked) < n:
            u = float(torch.rand((), generator=generator))
            if self.generic and u < generic_share:
                pool = self.generic
            else:
                pool = self.items
            picked.append(pool[int(torch.randint(len(pool), (1,), generator=generator))])
        return picked

    # ------------------------------------------------------------------ persistence
    def save(self, folder: str | os.PathLike) -> None:
        """Write the verified items (not the generic pool) to ``folder``."""
        os.makedirs(folder, exist_ok=True)
        tensors = {}
        starts = []
        for i, it in enumerate(self.items):
            for name in ("input_ids", "states", "topk_ids", "topk_logprobs", "next_logprob"):
                tensors[f"{i}.{name}"] = it[name].contiguous()
            starts.append(int(it["response_start"]))
        save_file(tensors, os.path.join(folder, BUFFER_WEIGHTS))
        with open(os.path.join(folder, BUFFER_INDEX), "w") as f:
            json.dump({"layer_ids": self.layer_ids, "hidden_size": self.hidden_size, "max_bytes": self.max_bytes,
                       "generic_max_bytes": self.generic_max_bytes, "response_starts": starts, "added": self.added,
                       "added_tokens": self.added_tokens, "dropped": self.dropped}, f, indent=1)

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "ReplayBuffer":
        index = os.path.join(folder, BUFFER_INDEX)
        if not os.path.isfile(index):
            raise FileNotFoundError(f"no replay buffer in {folder} (expected {BUFFER_INDEX})")
        with open(index) as f:
            meta = json.load(f)
        buffer = cls(meta["layer_ids"], meta["hidden_size"], meta["max_bytes"], meta["generic_max_bytes"])
        tensors = load_file(os.path.join(folder, BUFFER_WEIGHTS)) if meta["response_starts"] else {}
        for i, start in enumerate(meta["response_starts"]):
            item = {name: tensors[f"{i}.{name}"] for name in ("input_ids", "states", "topk_ids", "topk_logprobs", "next_logprob")}
            item["response_start"] = int(start)
            buffer.add(item)
        buffer.added, buffer.added_tokens, buffer.dropped = meta["added"], meta["added_tokens"], meta["dropped"]
        return buffer
