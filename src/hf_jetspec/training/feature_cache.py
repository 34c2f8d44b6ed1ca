"""Offline feature cache: the frozen target's read-layer states and top-k distributions, on disk.

Drafter training with ``corpus`` or ``erase`` labels needs, per training sequence, only what one
target forward gives: the hidden states at the drafter's read layers and the next-token
distribution at every position. Computing them once and reading them back over several epochs
removes the target forward from every later step (most of a CPU step). The distribution is kept
as its top-k log-probabilities (the rest is dropped, so the label is the target's law truncated to
its k most likely tokens and renormalised), plus the exact log-probability of the corpus's own
next token, which the ``erase`` survival gate needs.

Layout of a cache folder: ``feature_cache.json`` (target signature, read layers, k, shards) and
``features-NNNNN.safetensors`` shards holding, for sequence i, ``{i}.input_ids``, ``{i}.states``
[T, n_read * H] (float16, or bfloat16), ``{i}.topk_ids`` [T, k] (int32), ``{i}.topk_logprobs`` [T, k]
(float16) and ``{i}.next_logprob`` [T] (float32), and ``{i}.response_start``.

Large caches can store the states in 8-bit floats (``states_storage="float8_e4m3fn"``, the
index records it): each layer's slice of a token's states is divided by its own scale (absmax /
448, kept in ``{i}.states_scale`` [T, n_read], float32) and rounded to e4m3, which keeps 3
mantissa bits (relative error at most 1/16) over a range that the massive activations of a few
channels do not flatten, at 2.9 KB per token for five 576-wide layers instead of 5.8 KB. Reading
dequantises to bfloat16.
"""

from __future__ import annotations

import collections
import json
import os
from dataclasses import asdict, dataclass, field

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset

from .losses import MISSING_LOGIT

INDEX_NAME = "feature_cache.json"
STATE_STORAGES = ("float16", "bfloat16", "float8_e4m3fn")
FP8_MAX = 448.0  # the largest finite float8_e4m3fn


@dataclass
class FeatureCacheInfo:
    """What a cache holds and for which target; checked against the drafter before training."""

    target_model_type: str
    target_hidden_size: int
    target_num_hidden_layers: int
    target_vocab_size: int
    target_layer_ids: list[int]
    top_k: int
    num_sequences: int = 0
    num_tokens: int = 0
    shards: list[dict] = field(default_factory=list)  # {"file": name, "first": i0, "count": n}
    corpus_order: str = ""  # how the builder ordered its corpus ("source": a prefix-stable order, or e.g. "shuffled:0")
    corpus_size: int = 0  # sequences the build was asked for
    states_storage: str = ""  # "float8_e4m3fn": states stored scaled in 8 bits (else as written: float16 or bfloat16)

    def check_drafter(self, drafter) -> None:
        c = drafter.config
        mine = (self.target_model_type, self.target_hidden_size, self.target_num_hidden_layers, self.target_vocab_size)
        theirs = (c.target_model_type, c.target_hidden_size, c.target_num_hidden_layers, c.target_vocab_size)
        if mine != theirs:
            raise ValueError(f"the feature cache was made with a target {mine} (type, hidden, layers, vocab); the drafter's target is {theirs}")
        if list(self.target_layer_ids) != list(c.target_layer_ids):
            raise ValueError(f"the feature cache gives target layers {self.target_layer_ids} but the drafter reads {list(c.target_layer_ids)}; "
                             f"open it with FeatureCacheDataset(folder, layer_ids=...) if it holds them, else rebuild it")


def read_layer_ids(target, layers: str | None = None, drafter: str | None = None) -> list[int]:
    """The target layers a cache stores: ``layers`` (a comma list), else those the ``drafter`` folder
    reads, else the default read layers for the target's depth."""
    from ..drafter.configuration_drafter import JetSpecDrafterConfig, default_target_layer_ids

    if layers:
        return [int(x) for x in layers.split(",")]
    if drafter:
        return list(JetSpecDrafterConfig.from_pretrained(drafter).target_layer_ids)
    return default_target_layer_ids(target.config.get_text_config().num_hidden_layers)


def quantize_states(states: torch.Tensor, num_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """States [T, L * H] -> (float8_e4m3fn [T, L * H], float32 scales [T, L]): every layer's slice of
    a row is divided by absmax / 448 (1 for an all-zero slice) before rounding."""
    t, width = states.shape
    x = states.float().view(t, num_layers, width // num_layers)
    scale = x.abs().amax(-1) / FP8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(t, width), scale


def dequantize_states(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The inverse of :func:`quantize_states` (up to rounding), in ``dtype``."""
    t, width = q.shape
    x = q.float().view(t, scale.shape[-1], width // scale.shape[-1]) * scale.float()[..., None]
    return x.view(t, width).to(dtype)


def layer_columns(stored: list[int], wanted: list[int], hidden: int) -> torch.Tensor | None:
    """Column indices of ``wanted`` layers' states inside states stored for ``stored`` layers ([T, len(stored) * hidden]);
    None when ``wanted`` is ``stored``."""
    if list(wanted) == list(stored):
        return None
    missing = [i for i in wanted if i not in stored]
    if missing:
        raise ValueError(f"the feature cache holds target layers {stored}, not {missing}")
    return torch.cat([torch.arange(stored.index(i) * hidden, (stored.index(i) + 1) * hidden) for i in wanted])


def next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t + 1] | ids[:t + 1]) for every t (the last position repeats its own token)."""
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
    return torch.log_softmax(logits.float(), -1).gather(-1, nxt.to(logits.device)[..., None]).squeeze(-1)


@torch.no_grad()
def build_feature_cache(target, corpus: list[dict], layer_ids: list[int], folder: str | os.PathLike, top_k: int = 64,
                        batch_size: int = 4, shard_sequences: int = 256, progress: bool = True, resume: bool = False,
                        states_dtype: torch.dtype | None = None, corpus_order: str = "source") -> FeatureCacheInfo:
    """Run ``target`` once over ``corpus`` (items of :func:`~hf_jetspec.training.load_training_corpus`) and write the cache.

    The index is rewritten after every shard, so an interrupted build keeps every finished shard.
    With ``resume`` an existing cache in ``folder`` (same target, read layers and k) is continued:
    its ``num_sequences`` first corpus items are taken as done (pass the same corpus, in the same
    order) and new shards are appended. ``corpus_order`` names that order; only ``"source"`` (a
    prefix-stable order) lets a resumed build take a longer corpus. ``states_dtype``: how states are stored
    (default float16; bfloat16 keeps the range of a bf16 target's large activations)."""
    from tqdm.auto import tqdm

    cfg = target.config.get_text_config()
    info = FeatureCacheInfo(cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, list(layer_ids), int(top_k))
    states_dtype = states_dtype or torch.float16
    info.corpus_order = corpus_order
    if states_dtype == torch.float8_e4m3fn:
        info.states_storage, states_dtype = "float8_e4m3fn", torch.bfloat16  # quantised by the writer
    done = 0
    if resume and os.path.isfile(os.path.join(folder, INDEX_NAME)):
        old = load_feature_cache_info(folder)
        mine = (info.target_model_type, info.target_hidden_size, info.target_num_hidden_layers, info.target_vocab_size, info.target_layer_ids, info.top_k)
        theirs = (old.target_model_type, old.target_hidden_size, old.target_num_hidden_layers, old.target_vocab_size, list(old.target_layer_ids), old.top_k)
        if mine != theirs:
            raise ValueError(f"cannot resume the cache in {folder}: it holds {theirs} (target type, hidden, layers, vocab, read layers, "
                             f"top-k), this build makes {mine}")
        if old.states_storage != info.states_storage:
            raise ValueError(f"cannot resume the cache in {folder}: its states are stored as {old.states_storage or 'written'!r}, "
                             f"this build asks for {info.states_storage or 'written'!r}")
        if old.corpus_order != corpus_order:
            raise ValueError(f"cannot resume the cache in {folder}: it was built from a corpus in order {old.corpus_order!r}, "
                             f"this build passes {corpus_order!r}")
        if corpus_order != "source" and len(corpus) != old.corpus_size:
            raise ValueError(f"cannot resume the cache in {folder} with {len(corpus)} sequences: its corpus order {corpus_order!r} "
                             f"depends on the corpus size ({old.corpus_size}); build growing caches in source order")
        info, done = old, old.num_sequences
        if done > len(corpus):
            raise ValueError(f"the cache in {folder} already holds {done} sequences, more than the {len(corpus)} of this corpus")
    info.corpus_size = max(info.corpus_size, len(corpus))
    os.makedirs(folder, exist_ok=True)
    writer = FeatureCacheWriter(folder, info, shard_sequences)
    bar = tqdm(total=len(corpus), initial=done, desc="caching target features", disable=not progress)
    target.eval()
    for b0 in range(done, len(corpus), batch_size):
        batch = corpus[b0 : b0 + batch_size]
        lengths = [len(x["input_ids"]) for x in batch]
        ids = torch.zeros(len(batch), max(lengths), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, x in enumerate(batch):
            ids[j, : lengths[j]] = torch.tensor(x["input_ids"])
            mask[j, : lengths[j]] = 1
        out = target(input_ids=ids.to(target.device), attention_mask=mask.to(target.device), output_hidden_states=[i + 1 for i in layer_ids])
        states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1).to(states_dtype).cpu()
        logp = torch.log_softmax(out.logits.float(), -1)
        top = logp.topk(top_k, dim=-1)
        nxt = next_token_logprobs(out.logits, ids).cpu()
        for j, x in enumerate(batch):
            n = lengths[j]
            writer.add(b0 + j, {
                "input_ids": ids[j, :n],
                "response_start": torch.tensor([int(x["response_start"])]),
                "states": states[j, :n],
                "topk_ids": top.indices[j, :n].to(torch.int32).cpu(),
                "topk_logprobs": top.values[j, :n].to(torch.float16).cpu(),
                "next_logprob": nxt[j, :n],
            })
        bar.update(len(batch))
    writer.close(len(corpus))
    bar.close()
    return info


class FeatureCacheWriter:
    """Appends sequences to a cache folder, a shard at a time. The index is rewritten (atomically)
    after every shard, so an interrupted writer leaves every finished shard usable and resumable."""

    def __init__(self, folder: str | os.PathLike, info: FeatureCacheInfo, shard_sequences: int = 256):
        self.folder, self.info, self.shard_sequences = str(folder), info, int(shard_sequences)
        self.pending: dict[str, torch.Tensor] = {}
        self.first = info.num_sequences

    def add(self, index: int, item: dict) -> bool:
        """Queue sequence ``index`` (``input_ids``, ``response_start``, ``states``, ``topk_ids``,
        ``topk_logprobs``, ``next_logprob``); returns whether a shard was written."""
        if self.info.states_storage == "float8_e4m3fn" and "states" in item:
            q, scale = quantize_states(item["states"], len(self.info.target_layer_ids))
            item = {**item, "states": q, "states_scale": scale}
        for name, value in item.items():
            self.pending[f"{index}.{name}"] = value.contiguous().clone()
        if index + 1 - self.first >= self.shard_sequences:
            self.flush(index + 1)
            return True
        return False

    def flush(self, upto: int) -> None:
        if upto == self.first or not self.pending:
            return
        name = f"features-{len(self.info.shards):05d}.safetensors"
        save_file(self.pending, os.path.join(self.folder, name))
        self.info.shards.append({"file": name, "first": self.first, "count": upto - self.first})
        self.info.num_sequences = upto
        self.info.num_tokens += sum(int(v.numel()) for k, v in self.pending.items() if k.endswith(".input_ids"))
        self.write_index()
        self.pending, self.first = {}, upto

    def write_index(self) -> None:
        tmp = os.path.join(self.folder, INDEX_NAME + ".tmp")
        with open(tmp, "w") as f:
            json.dump(asdict(self.info), f, indent=1)
            f.write("\n")
        os.replace(tmp, os.path.join(self.folder, INDEX_NAME))  # never a half-written index

    def close(self, upto: int) -> None:
        self.flush(upto)
        self.write_index()


def load_feature_cache_info(folder: str | os.PathLike) -> FeatureCacheInfo:
    path = os.path.join(folder, INDEX_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {INDEX_NAME} in {folder}: build the cache with examples/cache_features.py (build_feature_cache)")
    try:
        with open(path) as f:
            info = FeatureCacheInfo(**json.load(f))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{path} is not a valid feature-cache index ({e}); rebuild the cache") from e
    if info.states_storage not in ("", *STATE_STORAGES):
        raise ValueError(f"{path} stores states as {info.states_storage!r}, which this version cannot read (known: {STATE_STORAGES})")
    return info


class FeatureCacheDataset(Dataset):
    """Training sequences with their cached target features (one item per sequence).

    ``layer_ids``: read only these of the stored layers (a drafter reading fewer layers trains on
    the same cache); ``info.target_layer_ids`` then names them. ``max_sequences``: only the cache's
    first N sequences (a cache that grew since, e.g. by a resumed regeneration, trains as it was)."""

    def __init__(self, folder: str | os.PathLike, layer_ids: list[int] | None = None, max_sequences: int | None = None):
        self.folder = str(folder)
        self.info = load_feature_cache_info(folder)
        self._columns = None
        if layer_ids is not None:
            self._columns = layer_columns(list(self.info.target_layer_ids), list(layer_ids), self.info.target_hidden_size)
            self.info.target_layer_ids = list(layer_ids)
        self._where = []
        for shard in self.info.shards:
            path = os.path.join(self.folder, shard["file"])
            if not os.path.isfile(path):
                raise FileNotFoundError(f"feature-cache shard {path} is missing; rebuild the cache")
            self._where.extend((path, shard["first"] + j) for j in range(shard["count"]))
        if max_sequences is not None:
            if not 0 < max_sequences <= len(self._where):
                raise ValueError(f"max_sequences={max_sequences}: the cache in {folder} holds {len(self._where)} sequences")
            self._where = self._where[:max_sequences]
        self._open: dict[str, object] = {}

    def __len__(self) -> int:
        return len(self._where)

    def _handle(self, path: str):
        if path not in self._open:
            try:
                self._open[path] = safe_open(path, framework="pt")
            except (SafetensorError, OSError) as e:
                raise ValueError(f"feature-cache shard {path} is unreadable ({e}); rebuild the cache") from e
        return self._open[path]

    def __getitem__(self, idx: int) -> dict:
        path, i = self._where[idx]
        f = self._handle(path)
        item = {name: f.get_tensor(f"{i}.{name}") for name in ("input_ids", "states", "topk_ids", "topk_logprobs", "next_logprob")}
        if item["states"].dtype == torch.float8_e4m3fn:
            item["states"] = dequantize_states(item["states"], f.get_tensor(f"{i}.states_scale"))
        if self._columns is not None:
            item["states"] = item["states"].index_select(-1, self._columns)
        item["response_start"] = int(f.get_tensor(f"{i}.response_start")[0])
        return item

    def __getstate__(self):  # file handles do not pickle (dataloader workers reopen them)
        return {**self.__dict__, "_open": {}}


def cached_answer_counts(dataset: "FeatureCacheDataset") -> collections.Counter:
    """How often each token id occurs in the responses of a cache's sequences (reads ids only)."""
    counts = collections.Counter()
    for i in range(len(dataset)):
        path, j = dataset._where[i]
        f = dataset._handle(path)
        ids = f.get_tensor(f"{j}.input_ids")
        start = int(f.get_tensor(f"{j}.response_start")[0])
        counts.update(ids[start:].tolist())
    return counts


def frequent_cached_tokens(dataset: "FeatureCacheDataset", n: int | None = None) -> list[int]:
    """The ``n`` most frequent response token ids of a cache's sequences, most frequent first and
    equal counts by id (a draft vocabulary; every id the responses use when ``n`` is None)."""
    from ..drafter.draft_vocab import ranked_by_count

    return ranked_by_count(cached_answer_counts(dataset))[:n]


@dataclass
class FeatureCacheCollator:
    """Right-pads cached sequences and their features into a batch."""

    pad_token_id: int

    def __call__(self, features: list[dict]) -> dict:
        lengths = [int(f["input_ids"].numel()) for f in features]
        width, bsz = max(lengths), len(features)

        def pad(name, fill, dtype=None):
            ref = features[0][name]
            out = torch.full((bsz, width, *ref.shape[1:]), fill, dtype=dtype or ref.dtype)
            for j, f in enumerate(features):
                out[j, : lengths[j]] = f[name]
            return out

        ids = pad("input_ids", self.pad_token_id, torch.long)
        mask = torch.zeros(bsz, width, dtype=torch.long)
        for j, n in enumerate(lengths):
            mask[j, :n] = 1
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "response_start": torch.tensor([f["response_start"] for f in features], dtype=torch.long),
            "length": torch.tensor(lengths, dtype=torch.long),
            "cached_states": pad("states", 0.0),
            "cached_topk_ids": pad("topk_ids", 0),
            "cached_topk_logprobs": pad("topk_logprobs", MISSING_LOGIT),
            "cached_next_logprob": pad("next_logprob", 0.0),
        }
