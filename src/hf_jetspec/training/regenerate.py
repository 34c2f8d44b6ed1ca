"""Training data written by the target itself: answers regenerated from training prompts, cached as they are generated.

Both seeds train their drafters on the target's own outputs: seed 000 regenerates its training
responses with the target, and seed 003's table puts corpus labels (answers written by other
models) at the bottom. Here the target answers prompts of the offline training sources in batches
(left padding, one key/value cache per batch), greedily by default, with an optional share sampled
at a temperature so that drafters also see sampled text. The forwards that generate the answers
also give what drafter training needs, so the feature cache (:mod:`.feature_cache`, the same
format ``examples/train_drafter.py --feature-cache`` reads) comes out of generation with no second
target pass: for every token of prompt and answer, the read-layer states, the top-k
log-probabilities of the next token and the log-probability of the token that actually follows.

Prompts come from the training sources only: ShareGPT first user turns (``"sharegpt"``), the
offline code corpus's requests (``"code"``: standard-library functions and code-bearing ShareGPT
chats) and, when asked for, later ShareGPT user turns with the conversation so far as context
(``"sharegpt-turns"``: first turns alone give about 7K prompts within 256 tokens; a later turn keeps the
newest exchanges of its conversation that fit the prompt length). Every prompt sharing a line of 30 or more characters with any evaluation prompt (GSM8K,
HumanEval, MT-Bench, AIME25: the code corpus's overlap rule) is excluded, as are exact repeats. The
order is fixed by the options, so an interrupted run resumes where its last shard ended.
Alongside the cache, ``regeneration.json`` records the target, dtype, sources and counts, the
sampling share, the SHA-256 of every prompt and the throughput.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from .feature_cache import STATE_STORAGES, FeatureCacheInfo, FeatureCacheWriter, load_feature_cache_info

MANIFEST_NAME = "regeneration.json"
SOURCES = ("sharegpt", "code")  # the default sources
ALL_SOURCES = (*SOURCES, "sharegpt-turns")  # later ShareGPT user turns, with the conversation so far as context


@dataclass
class RegenerationConfig:
    """What :func:`regenerate` generates and stores."""

    sources: tuple[str, ...] = SOURCES
    num_prompts: int = 1000
    max_prompt_tokens: int = 256
    max_new_tokens: int = 256
    batch_size: int = 32  # the fastest measured for SmolLM2-135M on 2 CPU cores (benchmarks/regeneration_throughput.py)
    sampled_share: float = 0.0  # share of prompts answered by sampling at ``temperature`` (the rest greedily)
    temperature: float = 0.7
    top_k: int = 64
    seed: int = 0
    shard_sequences: int = 256
    states_dtype: str = "float16"  # "bfloat16" keeps a bf16 target's large activations; "float8_e4m3fn" halves the disk (scaled per layer)

    def __post_init__(self):
        self.sources = tuple(self.sources)
        unknown = set(self.sources) - set(ALL_SOURCES)
        if unknown or not self.sources:
            raise ValueError(f"unknown regeneration source(s) {sorted(unknown)}: choose from {ALL_SOURCES}")
        if not 0.0 <= self.sampled_share <= 1.0:
            raise ValueError(f"sampled_share must lie in [0, 1], got {self.sampled_share}")
        if self.sampled_share > 0 and not self.temperature > 0:
            raise ValueError("a sampled share needs a temperature > 0")
        for name in ("num_prompts", "max_prompt_tokens", "max_new_tokens", "batch_size", "top_k", "shard_sequences"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.states_dtype not in STATE_STORAGES:
            raise ValueError(f"states_dtype must be one of {STATE_STORAGES}, got {self.states_dtype!r}")


@dataclass
class RegenerationPrompt:
    source: str
    input_ids: list[int]
    sha256: str  # of the prompt text
    sampled: bool = False


PROMPTS_NAME = "regeneration_prompts.json"


@dataclass
class RegenerationManifest:
    target: str
    dtype: str
    config: dict
    layer_ids: list[int]
    sources: dict = field(default_factory=dict)  # per source: prompts taken, excluded for overlap, repeats
    prompts_sha256: list[str] = field(default_factory=list)
    num_sequences: int = 0
    greedy: int = 0
    sampled: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the process's CPU time (all threads) spent generating: the cost in CPU-hours
    cpu_seconds_from: int = 0  # the sequences before this index were made by a run that did not count CPU time
    # cpu_seconds when the cache held that many sequences (every flush): what the first N answers cost,
    # exactly where the campaign's speed changed between runs
    cpu_seconds_at: dict = field(default_factory=dict)
    # one entry per run (stint) of the campaign: the first sequence it made and the caller's description
    # of the machine it ran on (``machine``), so the CPU-hours above say whose CPU-hours they are
    stints: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds else 0.0


def evaluation_lines(min_line_chars: int = 30) -> set[str]:
    """The long lines of every evaluation prompt installed here (the overlap rule's reference)."""
    from ..data import EVAL_SETS, MissingDatasetError
    from .code_corpus import prompt_lines

    texts = []
    for name, load in EVAL_SETS.items():
        try:
            texts.extend(turn for p in load() for turn in p.turns)
        except MissingDatasetError:
            continue
    return prompt_lines(texts, min_line_chars)


def _source_turns(source: str):
    """A training source's prompts in a fixed order: a first user turn's text, or (``"sharegpt-turns"``)
    the messages of a conversation up to one of its later user turns (the earlier answers are the
    dataset's; the target answers the last turn)."""
    if source == "sharegpt":
        from ..data import sharegpt_chats

        return (m[0]["content"] for m in sharegpt_chats())
    if source == "sharegpt-turns":
        return _later_turns()
    from .code_corpus import code_chats

    return (m[0]["content"] for m in code_chats())


def _later_turns():
    from ..data import sharegpt_chats

    for chat in sharegpt_chats(max_turns=8):
        for end in range(3, len(chat), 2):  # chat[:end] ends with user turn 2, 3, ...
            if chat[end - 1]["role"] == "user":
                yield chat[:end]


def regeneration_prompts(tokenizer, config: RegenerationConfig, exclude: set[str] | None = None) -> tuple[list[RegenerationPrompt], dict]:
    """``config.num_prompts`` prompts, taken in turn from each source (a fixed order), chat-templated,
    without overlap with ``exclude`` (evaluation lines; default :func:`evaluation_lines`), repeats
    or prompts over ``max_prompt_tokens``. A later turn whose conversation is longer keeps only its
    newest exchanges that fit (``context_cut`` counts them; overlap and repeats are judged on the
    whole conversation). Returns the prompts and per-source counts. The first
    ``round(sampled_share * i)`` changes at prompt ``i`` mark the prompts to sample, spread evenly."""
    from ..data import chat_input_ids
    from .code_corpus import overlaps

    exclude = evaluation_lines() if exclude is None else exclude
    streams = {s: _source_turns(s) for s in config.sources}
    stats = {s: {"prompts": 0, "overlapping": 0, "repeats": 0, "too_long": 0, "context_cut": 0} for s in config.sources}
    seen: set[str] = set()
    out: list[RegenerationPrompt] = []
    live = list(config.sources)
    while len(out) < config.num_prompts and live:
        for source in list(live):
            if len(out) >= config.num_prompts:
                break
            for text in streams[source]:
                messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
                key = text if isinstance(text, str) else json.dumps(messages, ensure_ascii=False)
                digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
                if digest in seen:
                    stats[source]["repeats"] += 1
                    continue
                seen.add(digest)
                if overlaps(messages, exclude):
                    stats[source]["overlapping"] += 1
                    continue
                # the chat template with its generation prompt; a base model's tokenizer has none: the text itself
                ids = chat_input_ids(tokenizer, messages)[0].tolist()
                cut = False
                while len(ids) > config.max_prompt_tokens and len(messages) > 2:
                    messages, cut = messages[2:], True  # a later turn keeps the newest exchanges that fit: the oldest goes first
                    ids = chat_input_ids(tokenizer, messages)[0].tolist()
                if len(ids) > config.max_prompt_tokens:
                    stats[source]["too_long"] += 1
                    continue
                stats[source]["context_cut"] += int(cut)
                i = len(out)
                sampled = round(config.sampled_share * (i + 1)) > round(config.sampled_share * i)
                out.append(RegenerationPrompt(source, ids, digest, sampled))
                stats[source]["prompts"] += 1
                break
            else:
                live.remove(source)  # exhausted
    return out, stats


def _selection_key(tokenizer, config: RegenerationConfig, exclude: set[str]) -> str:
    """What a prompt selection depends on: the options that choose prompts, the tokenizer and its chat
    template, and the evaluation lines excluded."""
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    return digest(json.dumps({
        "sources": list(config.sources), "num_prompts": config.num_prompts, "max_prompt_tokens": config.max_prompt_tokens,
        "sampled_share": config.sampled_share, "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
        "chat_template": digest(str(getattr(tokenizer, "chat_template", None))), "exclude": digest("\n".join(sorted(exclude))),
    }, sort_keys=True))


def selected_prompts(tokenizer, config: RegenerationConfig, folder: str | os.PathLike,
                     exclude: set[str] | None = None) -> tuple[list[RegenerationPrompt], dict]:
    """:func:`regeneration_prompts`, kept in ``folder`` (``regeneration_prompts.json``) and read back by
    a later run with the same selection (options, tokenizer, chat template, evaluation lines): a resumed
    campaign of tens of thousands of prompts does not template and tokenize them all again."""
    exclude = evaluation_lines() if exclude is None else exclude
    key = _selection_key(tokenizer, config, exclude)
    path = os.path.join(folder, PROMPTS_NAME)
    if os.path.isfile(path):
        with open(path) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            return [RegenerationPrompt(*p) for p in saved["prompts"]], saved["source_stats"]
    prompts, stats = regeneration_prompts(tokenizer, config, exclude)
    os.makedirs(folder, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"key": key, "source_stats": stats, "prompts": [[p.source, p.input_ids, p.sha256, p.sampled] for p in prompts]}, f)
    os.replace(path + ".tmp", path)
    return prompts, stats


def _drop_finished_rows(cache, keep: list[int], mask, positions, sample_rows, done):
    """Keep batch rows ``keep`` in the KV cache and the per-row tensors, then cut the left-padding
    columns no kept row attends to (when every cache layer is a plain growing one). Returns the new
    ``(mask, positions, sample_rows, done)``; the cache is changed in place."""
    from transformers.cache_utils import DynamicLayer

    index = torch.tensor(keep, device=mask.device)
    cache.batch_select_indices(index)
    mask, positions, sample_rows, done = mask[index], positions[index], sample_rows[index], done[index]
    first = int(mask.any(0).float().argmax())  # the first column some kept row has a real token in
    layers = getattr(cache, "layers", None)
    if first > 0 and layers and all(type(layer) is DynamicLayer for layer in layers):
        for layer in layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        mask = mask[:, first:]
    return mask, positions, sample_rows, done


def _record(row: dict, states: torch.Tensor, logp: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, fed: int, last_follow: int):
    """Append one forward's features of a row's last ``fed`` tokens: states, top-k, and the log p of
    the token that follows each (the next prompt token, then ``last_follow``)."""
    row["states"].append(states)
    row["topk_ids"].append(indices.to(torch.int32).cpu())
    row["topk_lp"].append(values.to(torch.float16).cpu())
    t0 = len(row["tokens"]) - fed
    follow = row["tokens"][t0 + 1:] + [last_follow]
    row["next_lp"].append(logp[torch.arange(len(follow), device=logp.device), torch.tensor(follow, device=logp.device)].cpu())


@torch.no_grad()
def generate_with_features(target, prompts: list[list[int]], sampled: list[bool], layer_ids: list[int], max_new_tokens: int,
                           top_k: int, temperature: float, eos_ids: set[int], pad_id: int, states_dtype: torch.dtype,
                           drop_finished: bool = True, features: bool = True) -> list[dict]:
    """Answer a batch of prompts (left padding, one cache) and return, per prompt, the feature-cache
    item of prompt + answer: ``input_ids``, ``response_start``, ``states`` [T, n*H], ``topk_ids`` /
    ``topk_logprobs`` [T, k] and ``next_logprob`` [T] (the last token's own, as the cache builder
    stores it), all from the generation forwards themselves. A row stops after its EOS token and
    leaves the batch (its cache rows with it), and the left padding no remaining row needs is cut, so a
    batch's tail costs what its live rows need (``drop_finished=False``: finished rows are fed padding
    to the end, kept to measure the difference). ``features=False`` asks the forwards for no hidden
    states and records nothing but the tokens: the items hold ``input_ids`` and ``response_start``
    (what an answer corpus keeps, :mod:`.answer_corpus`)."""
    device = target.device
    bsz, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((bsz, width), pad_id, dtype=torch.long)
    mask = torch.zeros(bsz, width, dtype=torch.long)
    for j, p in enumerate(prompts):
        ids[j, width - len(p):] = torch.tensor(p)
        mask[j, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    hidden = [i + 1 for i in layer_ids] if features else False
    rows = [{"tokens": list(p), "states": [], "topk_ids": [], "topk_lp": [], "next_lp": []} for p in prompts]
    sample_rows = torch.tensor(sampled, device=device)
    done = torch.zeros(bsz, dtype=torch.bool, device=device)
    # without features only the prompt's last logits are read: the head runs on one column, not the whole prompt
    out = target(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, output_hidden_states=hidden,
                 **({} if features else {"logits_to_keep": 1}))
    cache = out.cache
    live = list(range(bsz))  # the prompt each batch row answers: finished rows leave the batch
    fed: list[bool] = []  # per batch row: fed a real token by the last decode forward
    for step in range(max_new_tokens + 1):
        last = out.logits[:, -1].float()  # a left-padded prompt's last token is in the last column
        nxt = last.argmax(-1)
        drawing = (sample_rows & ~done).nonzero().squeeze(-1)  # only the sampled rows still answering draw
        if drawing.numel():
            nxt[drawing] = torch.multinomial(torch.softmax(last[drawing] / temperature, dim=-1), 1).squeeze(-1)
        final = step == max_new_tokens
        # the sequence's last token (after its EOS, or at the length limit) is followed by itself, as the cache builder stores it
        ends = [row_done or final for row_done in done.tolist()]
        if not features:
            pass
        elif step == 0:  # the prompt's forward: one row at a time, [n, V] rather than [B, n, V]
            states = torch.cat([out.hidden_states[h] for h in hidden], dim=-1)
            for j, row in enumerate(rows):
                logp = torch.log_softmax(out.logits[j, width - len(prompts[j]):].float(), dim=-1)
                top = logp.topk(top_k, dim=-1)
                _record(row, states[j, width - len(prompts[j]):].to(states_dtype).cpu(), logp, top.values, top.indices, len(prompts[j]),
                        row["tokens"][-1] if ends[j] else int(nxt[j]))
        else:  # a decode step: one column per row, the whole batch's log-probabilities and top-k at once
            states = torch.cat([out.hidden_states[h][:, -1] for h in hidden], dim=-1).to(states_dtype).cpu()
            step_logp = torch.log_softmax(last, dim=-1)
            step_top = step_logp.topk(top_k, dim=-1)
            for j in range(len(live)):
                if fed[j]:
                    row = rows[live[j]]
                    _record(row, states[j : j + 1], step_logp[j : j + 1], step_top.values[j : j + 1], step_top.indices[j : j + 1], 1,
                            row["tokens"][-1] if ends[j] else int(nxt[j]))
        if final:
            break
        feed, fed = [], []
        for j in range(len(live)):
            if done[j]:
                fed.append(False)
                feed.append(pad_id)
                continue
            token = int(nxt[j])
            rows[live[j]]["tokens"].append(token)
            fed.append(True)
            feed.append(token)
            if token in eos_ids:
                done[j] = True  # fed once more for its own state, then nothing after it
        if not any(fed):
            break
        keep = [j for j in range(len(live)) if fed[j]]
        if drop_finished and len(keep) < len(live):
            mask, positions, sample_rows, done = _drop_finished_rows(cache, keep, mask, positions, sample_rows, done)
            live, fed, feed = [live[j] for j in keep], [fed[j] for j in keep], [feed[j] for j in keep]
        mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype, device=device)], dim=1)
        positions = positions[:, -1:] + 1
        out = target(input_ids=torch.tensor(feed, device=device)[:, None], attention_mask=mask, position_ids=positions, cache=cache,
                     use_cache=True, output_hidden_states=hidden)
        cache = out.cache
    items = []
    for p, row in zip(prompts, rows):
        n = len(row["tokens"])
        if not features:
            items.append({"input_ids": torch.tensor(row["tokens"], dtype=torch.long), "response_start": torch.tensor([len(p)])})
            continue
        items.append({
            "input_ids": torch.tensor(row["tokens"], dtype=torch.long),
            "response_start": torch.tensor([len(p)]),
            "states": torch.cat(row["states"])[:n],
            "topk_ids": torch.cat(row["topk_ids"])[:n],
            "topk_logprobs": torch.cat(row["topk_lp"])[:n],
            "next_logprob": torch.cat(row["next_lp"])[:n].float(),
        })
    return items


def regenerate(target, tokenizer, folder: str | os.PathLike, layer_ids: list[int], config: RegenerationConfig,
               target_name: str = "", prompts: list[RegenerationPrompt] | None = None, source_stats: dict | None = None,
               resume: bool = False, progress: bool = True, deadline: float | None = None,
               machine: dict | None = None, on_batch=None) -> RegenerationManifest:
    """Answer ``prompts`` (default :func:`selected_prompts`) with ``target`` and write the feature
    cache and ``regeneration.json`` to ``folder``. ``resume`` continues a run with the same options:
    its finished shards are kept and generation goes on from the next prompt. ``deadline`` (a
    ``time.perf_counter()`` value) stops before the first batch that would start after it, except that
    an empty cache always gets its first batch (a budget spent on setup still yields data to train on);
    the cache then holds every answered prompt and a later ``resume`` goes on from there. ``machine``
    (e.g. CPU, threads, versions) is recorded with this run's first sequence in the manifest's ``stints``.
    ``on_batch(done)`` is called after every batch with the number of prompts answered so far."""
    from tqdm.auto import tqdm

    if prompts is None:
        prompts, source_stats = selected_prompts(tokenizer, config, folder)
    if not prompts:
        raise ValueError("no regeneration prompts: every candidate was excluded or the sources are empty")
    cfg = target.config.get_text_config()
    info = FeatureCacheInfo(cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, list(layer_ids), int(config.top_k),
                            corpus_order=f"regenerated:{config.seed}", corpus_size=len(prompts),
                            states_storage="float8_e4m3fn" if config.states_dtype == "float8_e4m3fn" else "")
    manifest = RegenerationManifest(target_name or getattr(target, "name_or_path", ""), str(target.dtype).replace("torch.", ""),
                                    asdict(config) | {"sources": list(config.sources)}, list(layer_ids), source_stats or {},
                                    [p.sha256 for p in prompts])
    path = os.path.join(folder, MANIFEST_NAME)
    done = 0
    if resume and os.path.isfile(path):
        old = json.loads(open(path).read())
        mine = {k: v for k, v in manifest.config.items() if k not in ("batch_size", "shard_sequences", "num_prompts")}
        theirs = {k: v for k, v in old["config"].items() if k not in ("batch_size", "shard_sequences", "num_prompts")}
        if mine != theirs or old["layer_ids"] != list(layer_ids) or old["prompts_sha256"] != manifest.prompts_sha256[: len(old["prompts_sha256"])]:
            raise ValueError(f"cannot resume the regeneration in {folder}: it was made with other options, read layers or prompts "
                             f"({theirs}, layers {old['layer_ids']}); start a new folder")
        info = load_feature_cache_info(folder)
        done = info.num_sequences
        for key in ("greedy", "sampled", "generated_tokens", "seconds"):
            setattr(manifest, key, old[key])
        manifest.cpu_seconds = old.get("cpu_seconds", 0.0)
        manifest.cpu_seconds_from = old.get("cpu_seconds_from", done if "cpu_seconds" not in old else 0)
        manifest.cpu_seconds_at = dict(old.get("cpu_seconds_at") or {str(done): manifest.cpu_seconds})
        manifest.stints = list(old.get("stints") or [])
        info.corpus_size = len(prompts)
    elif os.path.isfile(os.path.join(folder, "feature_cache.json")):
        raise FileExistsError(f"{folder} already holds a feature cache: pass resume=True (--resume) or choose another folder")
    os.makedirs(folder, exist_ok=True)
    writer = FeatureCacheWriter(folder, info, config.shard_sequences)
    manifest.stints.append({"first": done} | (machine or {}))

    def write_manifest():
        manifest.num_sequences = info.num_sequences
        manifest.cpu_seconds_at[str(info.num_sequences)] = round(manifest.cpu_seconds, 2)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(manifest) | {"tokens_per_s": round(manifest.tokens_per_s, 2)}, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)

    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids), 0)
    # float8 storage is quantised by the writer, per layer, from bfloat16 rows
    states_dtype = torch.bfloat16 if config.states_dtype == "float8_e4m3fn" else getattr(torch, config.states_dtype)
    torch.manual_seed(config.seed + done)
    target.eval()
    bar = tqdm(total=len(prompts), initial=done, desc="regenerating", unit="prompt", disable=not progress)
    upto = len(prompts)
    for b0 in range(done, len(prompts), config.batch_size):
        if deadline is not None and b0 > 0 and time.perf_counter() >= deadline:
            upto = b0
            break
        batch = prompts[b0 : b0 + config.batch_size]
        t0, c0 = time.perf_counter(), time.process_time()
        items = generate_with_features(target, [p.input_ids for p in batch], [p.sampled for p in batch], layer_ids,
                                       config.max_new_tokens, config.top_k, config.temperature, eos_ids, pad_id, states_dtype)
        manifest.seconds += time.perf_counter() - t0
        manifest.cpu_seconds += time.process_time() - c0
        for j, (p, item) in enumerate(zip(batch, items)):
            manifest.generated_tokens += int(item["input_ids"].numel()) - len(p.input_ids)
            manifest.sampled += int(p.sampled)
            manifest.greedy += int(not p.sampled)
            if writer.add(b0 + j, item):
                write_manifest()
        bar.update(len(batch))
        bar.set_postfix_str(f"{manifest.tokens_per_s:.1f} tok/s")
        if on_batch is not None:
            on_batch(b0 + len(batch))
    writer.close(upto)
    write_manifest()
    bar.close()
    return manifest
