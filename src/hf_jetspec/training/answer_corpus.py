"""The target's answers as a dataset that lives in the repository: compressed parquet shards, resumable anywhere.

A regeneration campaign keeps only what cannot be rebuilt cheaply: the token ids of the target's
answers. The features drafter training reads (hidden states, distributions) are recomputed from
those ids by the target inside the training loop (:class:`AnswerCorpusDataset` feeds
:class:`~hf_jetspec.training.JetSpecTrainer`, which runs the target's forward on each batch), so
nothing large is ever written to disk. A SmolLM2 answer is about 170 token ids; with brotli they
take about 1.3 bytes each, so 30,000 answers fit in a few MB of git.

Layout of a corpus folder (a Hugging Face dataset repository as it stands)::

    README.md                          the dataset card (rewritten from the manifest at every shard)
    manifest.json                      target, revision, dtype, options, counts, CPU time, stints
    data/train-000000-000512.parquet   rows [first, end) of the prompt selection, in order

One row per answered prompt: ``index`` (its place in the fixed prompt selection of
:func:`~hf_jetspec.training.regenerate.selected_prompts`), ``source``, ``prompt_sha256`` (the first
16 hex digits of the prompt's SHA-256: the prompt's ids are rebuilt from the sources, which keeps
the corpus within its size budget), ``prompt_tokens``, ``answer_ids``, ``sampled``, ``temperature``
(0 for greedy), ``target`` and ``revision``. Shard names carry their row range; the shards of a
corpus must tile ``[0, n)`` with no gap and no overlap (:func:`read_shard_ranges` refuses anything
else), so a run on any fresh checkout resumes at ``n``: no shard is made twice and none is skipped.
Each shard is written to a temporary name and renamed, and the manifest and card follow it, so an
interrupted run leaves only whole shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from .regenerate import RegenerationConfig, RegenerationPrompt, generate_with_features, selected_prompts

DATA_DIR = "data"
MANIFEST = "manifest.json"
CARD = "README.md"
SHARD_RE = re.compile(r"^train-(\d{6})-(\d{6})\.parquet$")
HASH_DIGITS = 16  # of a prompt's SHA-256 kept per row: enough to catch a changed selection, 8 bytes a row
COMPRESSION = ("brotli", 11)  # measured smallest for token ids (zstd 19: +9%, zstd 9: +18%)


def shard_name(first: int, end: int) -> str:
    return f"train-{first:06d}-{end:06d}.parquet"


def read_shard_ranges(folder: str | os.PathLike) -> list[tuple[int, int, str]]:
    """``(first, end, file)`` of every shard in ``folder/data``, in order; refuses a gap, an overlap or
    a file that is not a shard, naming it, so a corpus never trains or resumes on a hole."""
    data = os.path.join(folder, DATA_DIR)
    if not os.path.isdir(data):
        return []
    ranges = []
    for name in sorted(os.listdir(data)):
        if name.endswith(".tmp"):
            continue  # a shard being written by a run that stopped: never part of the corpus
        m = SHARD_RE.match(name)
        if not m:
            raise ValueError(f"{os.path.join(data, name)} is not an answer shard (expected names like {shard_name(0, 512)})")
        first, end = int(m.group(1)), int(m.group(2))
        if end <= first:
            raise ValueError(f"{name}: an empty or reversed row range")
        ranges.append((first, end, name))
    expected = 0
    for first, end, name in ranges:
        if first != expected:
            kind = "a gap" if first > expected else "an overlap"
            raise ValueError(f"the answer shards in {data} have {kind} at row {min(first, expected)} ({name} starts at {first}, "
                             f"the shards before it end at {expected}): restore the missing shard or remove the extra one")
        expected = end
    return ranges


def prompt_digest(prompt: RegenerationPrompt) -> str:
    return prompt.sha256[:HASH_DIGITS]


def selection_digest(prompts: list[RegenerationPrompt]) -> str:
    """One SHA-256 over the selection's per-prompt hashes: names the prompt list a corpus answers."""
    return hashlib.sha256("\n".join(p.sha256 for p in prompts).encode()).hexdigest()


@dataclass
class AnswerRow:
    index: int
    source: str
    prompt_sha256: str
    prompt_tokens: int
    answer_ids: list[int]
    sampled: bool
    temperature: float
    target: str
    revision: str


def write_shard(folder: str | os.PathLike, rows: list[AnswerRow]) -> str:
    """Write ``rows`` (consecutive indices) as one brotli parquet shard; returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first, end = rows[0].index, rows[-1].index + 1
    if [r.index for r in rows] != list(range(first, end)):
        raise ValueError("a shard's rows must have consecutive indices")
    table = pa.table({
        "index": pa.array([r.index for r in rows], pa.int32()),
        "source": pa.array([r.source for r in rows], pa.string()),
        "prompt_sha256": pa.array([r.prompt_sha256 for r in rows], pa.string()),
        "prompt_tokens": pa.array([r.prompt_tokens for r in rows], pa.int32()),
        "answer_ids": pa.array([r.answer_ids for r in rows], pa.list_(pa.int32())),
        "sampled": pa.array([r.sampled for r in rows], pa.bool_()),
        "temperature": pa.array([r.temperature for r in rows], pa.float32()),
        "target": pa.array([r.target for r in rows], pa.string()),
        "revision": pa.array([r.revision for r in rows], pa.string()),
    })
    data = os.path.join(folder, DATA_DIR)
    os.makedirs(data, exist_ok=True)
    path = os.path.join(data, shard_name(first, end))
    # token ids compress best without a dictionary; the few constant string columns get one
    pq.write_table(table, path + ".tmp", compression=COMPRESSION[0], compression_level=COMPRESSION[1],
                   use_dictionary=["source", "target", "revision"])
    os.replace(path + ".tmp", path)
    return path


def read_rows(folder: str | os.PathLike, limit: int | None = None) -> list[AnswerRow]:
    """The corpus's rows in order (the first ``limit`` only, when given)."""
    import pyarrow.parquet as pq

    rows: list[AnswerRow] = []
    for first, end, name in read_shard_ranges(folder):
        if limit is not None and first >= limit:
            break
        path = os.path.join(folder, DATA_DIR, name)
        try:
            table = pq.read_table(path).to_pydict()
        except Exception as e:  # pyarrow raises several kinds for a damaged file
            raise ValueError(f"{path} is not a readable parquet shard ({e}): restore it from git") from e
        if table["index"] != list(range(first, end)):
            raise ValueError(f"{path} holds rows {table['index'][:1]}..{table['index'][-1:]}, not the [{first}, {end}) its name says")
        keys = [f.name for f in AnswerRow.__dataclass_fields__.values()]
        rows.extend(AnswerRow(**{k: table[k][i] for k in keys}) for i in range(end - first))
    return rows if limit is None else rows[:limit]


@dataclass
class AnswerCorpusManifest:
    """What a corpus holds and what it cost; rewritten with every shard."""

    target: str
    revision: str
    dtype: str
    config: dict
    selection_sha256: str = ""  # selection_digest of the whole prompt list the rows index into
    selection_size: int = 0
    sources: dict = field(default_factory=dict)  # the selection's per-source counts (prompts, overlapping, repeats, ...)
    rows: int = 0
    greedy: int = 0
    sampled: int = 0
    answer_tokens: int = 0
    bytes: int = 0  # of the shards
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the generating process's CPU time, all threads: the campaign's cost in CPU-hours
    stints: list = field(default_factory=list)  # one per run: its first row, rows made, and the machine it ran on
    command: str = ""


def load_manifest(folder: str | os.PathLike) -> AnswerCorpusManifest | None:
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return AnswerCorpusManifest(**json.load(f))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{path} is not a valid answer-corpus manifest ({e}); restore it from git") from e


def write_manifest(folder: str | os.PathLike, manifest: AnswerCorpusManifest) -> None:
    path = os.path.join(folder, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump(asdict(manifest), f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    with open(os.path.join(folder, CARD), "w") as f:
        f.write(dataset_card(manifest))


def dataset_card(m: AnswerCorpusManifest) -> str:
    """The dataset card, from the manifest alone (so its figures are the corpus's own)."""
    sources = ", ".join(f"{name} ({s.get('prompts', 0):,} prompts selected)" for name, s in m.sources.items()) or "-"
    tokens = m.answer_tokens / m.rows if m.rows else 0.0
    cfg = m.config
    return f"""---
license: apache-2.0
language: [en]
task_categories: [text-generation]
tags: [speculative-decoding, hf-jetspec, distillation]
configs:
- config_name: default
  data_files:
  - split: train
    path: data/*.parquet
---

# {m.target} answers (hf_jetspec regeneration corpus)

The target's own answers to training prompts, kept as token ids: what hf_jetspec trains its
drafters on. The target's features are recomputed from these ids during training, so the corpus is
all a training run needs.

| | |
| --- | --- |
| target | {m.target} (`{m.revision}`), {m.dtype} |
| answers | {m.rows:,} ({m.greedy:,} greedy, {m.sampled:,} sampled at T = {cfg.get('temperature')}) |
| answer tokens | {m.answer_tokens:,} ({tokens:.0f} per answer, at most {cfg.get('max_new_tokens')}) |
| size | {m.bytes / 1e6:.2f} MB of brotli parquet ({m.bytes / max(m.answer_tokens, 1):.2f} bytes per answer token) |
| cost | {m.cpu_seconds / 3600:.2f} CPU-hours, {len(m.stints)} run(s) |
| prompt selection | {m.selection_size:,} prompts, SHA-256 `{m.selection_sha256[:16]}...` |

**Sources.** {sources}. Prompts are taken from the sources in turn, chat-templated, at most
{cfg.get('max_prompt_tokens')} tokens (a later ShareGPT turn keeps the newest exchanges that fit).

**Overlap rule.** Every prompt that shares a line of 30 or more characters with any evaluation
prompt installed (GSM8K, HumanEval, MT-Bench, AIME 2025) is left out, as are exact repeats, so
benchmarks on those sets measure prompts no training step touched.

**Rows.** `index` (place in the prompt selection), `source`, `prompt_sha256` (first {HASH_DIGITS} hex
digits), `prompt_tokens`, `answer_ids`, `sampled`, `temperature` (0 = greedy), `target`, `revision`.
The prompt's ids are rebuilt from the sources by `hf_jetspec.training.answer_corpus.AnswerCorpusDataset`,
which checks each hash. Load the rows alone with `datasets.load_dataset("parquet", data_dir="data")`.

**Reproduce or extend** (resumes from the shards present; each shard is committed as it is written):

```bash
{m.command}
```
"""


def revision_string(hub_id: str, weights: str) -> str:
    return f"{hub_id}@{weights}" if weights else hub_id


def regenerate_answers(target, tokenizer, folder: str | os.PathLike, config: RegenerationConfig, target_name: str, revision: str,
                       prompts: list[RegenerationPrompt] | None = None, source_stats: dict | None = None,
                       prompt_cache: str | os.PathLike | None = None, deadline: float | None = None,
                       on_shard: Callable[[str], None] | None = None, machine: dict | None = None, command: str = "",
                       progress: bool = True) -> AnswerCorpusManifest:
    """Answer the prompt selection with ``target`` and append the answers to the corpus in ``folder``,
    ``config.shard_sequences`` rows a shard, resuming after the shards already there (their options,
    target and prompt hashes must agree, or it refuses). ``prompts`` defaults to
    :func:`selected_prompts` kept in ``prompt_cache`` (a folder outside the corpus; default
    ``folder/../.answer-prompts``). ``deadline`` (``time.perf_counter()``) stops before a batch that
    would start after it; rows past the last whole shard are then dropped, not half-kept.
    ``on_shard(path)`` runs after each shard and the manifest and card are written (e.g. a git
    commit of the three). Generation runs without features: nothing but token ids is kept."""
    from tqdm.auto import tqdm

    if prompts is None:
        cache = prompt_cache or os.path.join(os.path.dirname(os.path.abspath(folder)), ".answer-prompts")
        prompts, source_stats = selected_prompts(tokenizer, config, cache)
    if not prompts:
        raise ValueError("no regeneration prompts: every candidate was excluded or the sources are empty")
    options = {k: v for k, v in asdict(config).items() if k not in ("top_k", "states_dtype")} | {"sources": list(config.sources)}
    dtype = str(target.dtype).replace("torch.", "")
    old = load_manifest(folder)
    ranges = read_shard_ranges(folder)
    done = ranges[-1][1] if ranges else 0
    if done and old is None:
        raise ValueError(f"{folder} holds answer shards but no {MANIFEST}: restore it from git")
    manifest = AnswerCorpusManifest(target_name, revision, dtype, options, selection_digest(prompts), len(prompts), source_stats or {},
                                    command=command)
    if old is not None and done:
        same = {k: v for k, v in old.config.items() if k not in ("batch_size", "shard_sequences", "num_prompts")}
        mine = {k: v for k, v in options.items() if k not in ("batch_size", "shard_sequences", "num_prompts")}
        if same != mine or (old.target, old.revision, old.dtype) != (target_name, revision, dtype):
            raise ValueError(f"cannot extend the answers in {folder}: they were made by {old.target} ({old.revision}, {old.dtype}) "
                             f"with {same}; this run is {target_name} ({revision}, {dtype}) with {mine}")
        for key in ("rows", "greedy", "sampled", "answer_tokens", "bytes", "seconds", "cpu_seconds", "stints"):
            setattr(manifest, key, getattr(old, key))
        last = read_rows(folder)[done - 1 :] if done else []
        if done > len(prompts) or (last and last[0].prompt_sha256 != prompt_digest(prompts[done - 1])):
            raise ValueError(f"the answers in {folder} index another prompt selection (row {done - 1}'s prompt differs, "
                             f"or the selection has {len(prompts)} prompts < {done} rows): the sources or the evaluation sets changed")
    os.makedirs(folder, exist_ok=True)
    manifest.stints.append({"first": done, "rows": 0} | (machine or {}))
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids), 0)
    torch.manual_seed(config.seed + done)
    target.eval()
    end = min(len(prompts), config.num_prompts)
    bar = tqdm(total=end, initial=done, desc="answering", unit="answer", disable=not progress)
    pending: list[AnswerRow] = []
    spent = [0.0, 0.0]  # seconds, CPU seconds of the pending rows

    def flush():
        path = write_shard(folder, pending)
        manifest.rows += len(pending)
        manifest.greedy += sum(not r.sampled for r in pending)
        manifest.sampled += sum(r.sampled for r in pending)
        manifest.answer_tokens += sum(len(r.answer_ids) for r in pending)
        manifest.bytes += os.path.getsize(path)
        manifest.seconds += spent[0]
        manifest.cpu_seconds += spent[1]
        manifest.stints[-1]["rows"] += len(pending)
        write_manifest(folder, manifest)
        pending.clear()
        spent[0] = spent[1] = 0.0
        if on_shard is not None:
            on_shard(path)

    for b0 in range(done, end, config.batch_size):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        batch = prompts[b0 : min(b0 + config.batch_size, end)]
        t0, c0 = time.perf_counter(), time.process_time()
        items = generate_with_features(target, [p.input_ids for p in batch], [p.sampled for p in batch], [], config.max_new_tokens, 1,
                                       config.temperature, eos_ids, pad_id, torch.float32, features=False)
        spent[0] += time.perf_counter() - t0
        spent[1] += time.process_time() - c0
        for j, (p, item) in enumerate(zip(batch, items)):
            pending.append(AnswerRow(b0 + j, p.source, prompt_digest(p), len(p.input_ids), item["input_ids"][len(p.input_ids):].tolist(),
                                     bool(p.sampled), float(config.temperature) if p.sampled else 0.0, target_name, revision))
            if len(pending) == config.shard_sequences or b0 + j + 1 == end:
                flush()
        bar.update(len(batch))
    bar.close()
    if not ranges and not manifest.rows:
        write_manifest(folder, manifest)  # a run stopped before its first shard still leaves the corpus's description
    return manifest


class AnswerCorpusDataset(torch.utils.data.Dataset):
    """Training sequences (prompt + the target's answer) from an answer corpus, for :class:`~hf_jetspec.training.JetSpecTrainer`
    with :class:`~hf_jetspec.training.corpus.CorpusCollator`: items ``{"input_ids", "response_start"}``,
    no features (the trainer's target forward computes them per batch).

    The prompts' ids are rebuilt with :func:`selected_prompts` under the corpus's own options
    (``prompts`` may pass them in), kept in ``prompt_cache``, and every row's prompt hash is checked
    against them. ``limit``: the first N rows only (a corpus that grew since trains as it was).
    ``max_length`` cuts each sequence's answer (never its prompt)."""

    def __init__(self, folder: str | os.PathLike, tokenizer=None, prompts: list[RegenerationPrompt] | None = None,
                 prompt_cache: str | os.PathLike | None = None, limit: int | None = None, max_length: int | None = None):
        manifest = load_manifest(folder)
        if manifest is None:
            raise FileNotFoundError(f"no {MANIFEST} in {folder}: not an answer corpus (examples/regenerate.py --answers writes one)")
        self.manifest = manifest
        self.rows = read_rows(folder, limit)
        if prompts is None:
            if tokenizer is None:
                raise ValueError("AnswerCorpusDataset needs the target's tokenizer (or the prompts) to rebuild the prompts")
            config = RegenerationConfig(**{k: v for k, v in manifest.config.items() if k in RegenerationConfig.__dataclass_fields__})
            cache = prompt_cache or os.path.join(os.path.dirname(os.path.abspath(folder)), ".answer-prompts")
            prompts, _ = selected_prompts(tokenizer, config, cache)
        for row in self.rows:
            if row.index >= len(prompts) or prompt_digest(prompts[row.index]) != row.prompt_sha256:
                raise ValueError(f"row {row.index} of {folder} answers a prompt this selection does not have at that place: "
                                 "the sources, the tokenizer or the evaluation sets differ from the corpus's")
        self.prompts = prompts
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        prompt = self.prompts[row.index].input_ids
        ids = list(prompt) + list(row.answer_ids)
        if self.max_length is not None:
            ids = ids[: max(self.max_length, len(prompt) + 1)]
        return {"input_ids": ids, "response_start": len(prompt)}
