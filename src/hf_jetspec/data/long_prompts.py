"""Long-prompt evaluation sets (``long-2k``, ``long-4k``, ``long-8k``): answers that copy their prompt.

Retrieval-augmented answers, summaries and code edits put thousands of tokens in the prompt. These
sets build such prompts from offline sources only:

- ``long-chat-SIZE``: a long ShareGPT conversation written out as a transcript, then "summarise",
  "list the main points" or "quote the two most important sentences". The conversations come from
  the end of the file, far from the first chats that training and calibration read.
- ``long-code-SIZE``: a Python standard-library module, then "add type hints", "add docstrings" or
  "rename a function" (the whole edited code is asked for back).
- ``long-SIZE``: both.

``SIZE`` is ``2k``, ``4k`` or ``8k``: each document is cut to ``SIZE - 256`` tokens of the target's
tokenizer (at a line end), so the prompt with its chat template and instruction stays under
``SIZE - 128`` tokens and 128 new tokens fit in an 8k context. The same documents serve every size.
"""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

from .sources import EvalPrompt, iter_sharegpt

SIZES = {"2k": 2048, "4k": 4096, "8k": 8192}
KINDS = ("chat", "code")
DOC_MARGIN = 256  # tokens of a SIZE left for the chat template, the instruction and the answer

CHAT_TASKS = (
    ("summary", "Summarise the conversation above in one paragraph."),
    ("points", "List the main points of the conversation above."),
    ("quote", "Quote the two most important sentences of the conversation above, word for word."),
)
CODE_TASKS = (  # (task, standard-library module, instruction; {name} is a function the cut text defines)
    ("type-hints", "statistics", "Add type hints to every function in the code above. Return the whole edited code."),
    ("docstrings", "configparser", "Add a docstring to every function in the code above that lacks one. Return the whole edited code."),
    ("rename", "dataclasses", "Rename the function `{name}` to `{name}_v2` everywhere in the code above. Return the whole edited code."),
)
MIN_CHAT_WORDS = 7_000  # conversations long enough for the 8k cut (words: a long run of symbols is few tokens)


def parse_long_set(name: str) -> tuple[tuple[str, ...], int] | None:
    """``"long-code-4k"`` -> ``(("code",), 4096)``; ``"long-2k"`` -> ``(("chat", "code"), 2048)``; None for other names."""
    m = re.fullmatch(r"long-(?:(chat|code)-)?(2k|4k|8k)", name.lower())
    if m is None:
        return None
    return ((m.group(1),) if m.group(1) else KINDS), SIZES[m.group(2)]


def cut_to_tokens(tokenizer, text: str, max_tokens: int) -> str:
    """A prefix of ``text`` with at most ``max_tokens`` tokens, ending a line where the last line
    end is in the last tenth of the ``max_tokens`` cut (else a word)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    head = tokenizer.decode(ids[:max_tokens])
    for sep in ("\n", " "):
        cut = head.rfind(sep)
        if cut >= 0.9 * len(head):
            return head[:cut]
    return head


def _transcript(messages: list[dict]) -> str:
    who = {"user": "User", "assistant": "Assistant"}
    return "\n\n".join(f"{who[m['role']]}: {m['content'].strip()}" for m in messages)


def long_conversations(count: int = len(CHAT_TASKS), path=None) -> list[tuple[int, str]]:
    """(index in the file, transcript) of the last ``count`` conversations of at least
    ``MIN_CHAT_WORDS`` words that alternate user and assistant turns."""
    roles = {"human": "user", "gpt": "assistant"}
    found: list[tuple[int, str]] = []
    for i, conv in enumerate(iter_sharegpt(path)):
        turns = conv.get("conversations") or []
        messages = [{"role": roles.get(t.get("from")), "content": t.get("value") or ""} for t in turns]
        if len(messages) < 2 or any(m["role"] is None or not m["content"].strip() for m in messages):
            continue
        if any(a["role"] == b["role"] for a, b in zip(messages, messages[1:])) or messages[0]["role"] != "user":
            continue
        text = _transcript(messages)
        if len(text.split()) >= MIN_CHAT_WORDS:
            found.append((i, text))
            found = found[-count:]
    if len(found) < count:
        raise ValueError(f"only {len(found)} ShareGPT conversations have {MIN_CHAT_WORDS} words; {count} needed")
    return found


def stdlib_source(module: str) -> str:
    """The source of a pure-Python standard-library module of the running interpreter."""
    path = Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"
    return path.read_text(encoding="utf-8")


def first_function(code: str) -> str:
    """The name of the first function ``code`` defines that it also calls or names again."""
    names = re.findall(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", code, flags=re.M)
    for name in names:
        if len(re.findall(rf"\b{re.escape(name)}\b", code)) > 1:
            return name
    if not names:
        raise ValueError("the code defines no function")
    return names[0]


def long_prompts(name: str, tokenizer) -> list[EvalPrompt]:
    """The prompts of a long set (see the module docstring), cut with ``tokenizer``."""
    parsed = parse_long_set(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a long-prompt set: use long-2k|4k|8k or long-chat-/long-code-2k|4k|8k")
    kinds, size = parsed
    budget = size - DOC_MARGIN
    out = []
    tag = name.lower().split("-")[-1]
    if "chat" in kinds:
        for (task, instruction), (index, text) in zip(CHAT_TASKS, long_conversations()):
            doc = cut_to_tokens(tokenizer, text, budget)
            out.append(EvalPrompt(f"long-chat-{tag}-{task}", (f"{doc}\n\n{instruction}",), f"long-chat-{tag}",
                                  {"kind": "chat", "sharegpt_index": index, "size": size}))
    if "code" in kinds:
        for task, module, instruction in CODE_TASKS:
            doc = cut_to_tokens(tokenizer, stdlib_source(module), budget)
            text = instruction.format(name=first_function(doc)) if "{name}" in instruction else instruction
            out.append(EvalPrompt(f"long-code-{tag}-{task}", (f"```python\n{doc}\n```\n\n{text}",), f"long-code-{tag}",
                                  {"kind": "code", "module": module, "python": sys.version.split()[0], "size": size}))
    return out
