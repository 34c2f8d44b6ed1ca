"""Code training chats that are available offline: functions of the Python standard library, and the
code-bearing ShareGPT conversations, with no overlap with the evaluation prompts.

Standard-library functions (PSF License, shipped with every interpreter) and those of installed
packages (each under its own licence, recorded by :func:`package_licence`) become chats in the shape
of a coding request: the user gives the function's signature and docstring and asks for an
implementation; the assistant answers with the whole function in a code block. ShareGPT
conversations are kept when their answer holds a fenced code block.

Overlap with evaluation prompts is checked line by line: a chat is dropped when any of its lines
(stripped, at least ``min_line_chars`` characters) is also a line of an evaluation prompt.
"""

from __future__ import annotations

import ast
import os
import sysconfig
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

INSTRUCTIONS = (
    "Implement this Python function. Answer with the complete function in a code block.",
    "Write the body of the following Python function and return the whole function in a code block.",
    "Here is a Python function signature with its docstring. Write the implementation.",
)


@dataclass(frozen=True)
class SourceFunction:
    """A documented function from a source file: where it is, its header (signature and docstring) and its whole source."""

    module: str
    name: str
    header: str
    source: str


def function_header(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The function's lines up to and including its docstring (the part a user would show), or None without a docstring."""
    if not node.body or not isinstance(node.body[0], ast.Expr) or not isinstance(getattr(node.body[0], "value", None), ast.Constant):
        return None
    if not isinstance(node.body[0].value.value, str) or len(node.body) < 2:
        return None
    lines = source.splitlines()
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    return "\n".join(lines[start : node.body[0].end_lineno]) + "\n"


def documented_functions(path: str | os.PathLike, module: str, min_lines: int = 4, max_lines: int = 60) -> list[SourceFunction]:
    """Documented public functions of one file, top-level and methods of top-level classes (dedented),
    with ``min_lines .. max_lines`` lines (none if the file does not parse)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = text.splitlines()
    nodes = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            nodes.extend((f"{node.name}.", n) for n in node.body)
        else:
            nodes.append(("", node))
    out = []
    for prefix, node in nodes:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
            continue
        header = function_header(text, node)
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        n = node.end_lineno - start
        if header is None or not min_lines <= n <= max_lines:
            continue
        source = textwrap.dedent("\n".join(lines[start : node.end_lineno]) + "\n")
        out.append(SourceFunction(module, prefix + node.name, textwrap.dedent(header), source))
    return out


def package_root(name: str) -> Path:
    """The source folder of an installed package."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name!r} is not an installed package")
    return Path(list(spec.submodule_search_locations)[0])


def package_licence(name: str) -> str:
    """The licence an installed distribution declares (its License field, else its licence classifiers)."""
    from importlib import metadata

    try:
        meta = metadata.metadata(name)
    except metadata.PackageNotFoundError:
        return "unknown"
    text = meta.get("License-Expression") or meta.get("License") or ""
    if text and len(text) < 80:
        return text
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")]
    return "; ".join(classifiers) or (text.splitlines()[0][:80] if text else "unknown")


SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "testing", "idlelib", "lib2to3", "__pycache__", "_vendor", "vendored"}


def source_functions(root: str | os.PathLike, package: str = "", **kwargs) -> Iterator[SourceFunction]:
    """Documented functions of the ``.py`` files under ``root`` (tests and vendored copies skipped), in a fixed order."""
    root = Path(root)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_PARTS & set(rel.parts):
            continue
        module = ".".join(([package] if package else []) + list(rel.with_suffix("").parts))
        yield from documented_functions(path, module, **kwargs)


def stdlib_functions(**kwargs) -> Iterator[SourceFunction]:
    """Documented functions of the interpreter's pure-Python standard library (PSF License)."""
    yield from source_functions(sysconfig.get_paths()["stdlib"], **kwargs)


def function_chat(fn: SourceFunction, variant: int = 0) -> list[dict]:
    """A coding request for ``fn`` and its answer, as chat messages."""
    instruction = INSTRUCTIONS[variant % len(INSTRUCTIONS)]
    return [
        {"role": "user", "content": f"{instruction}\n\n```python\n{fn.header}```"},
        {"role": "assistant", "content": f"```python\n{fn.source}```"},
    ]


def has_code_block(messages: list[dict]) -> bool:
    return any(m["role"] == "assistant" and "```" in m["content"] for m in messages)


def prompt_lines(texts: Iterable[str], min_line_chars: int = 30) -> set[str]:
    """The stripped lines of at least ``min_line_chars`` characters of ``texts``."""
    return {line.strip() for text in texts for line in text.splitlines() if len(line.strip()) >= min_line_chars}


def overlaps(messages: list[dict], lines: set[str], min_line_chars: int = 30) -> bool:
    """Whether any long enough line of the chat is one of ``lines``."""
    return any(line.strip() in lines for m in messages for line in m["content"].splitlines() if len(line.strip()) >= min_line_chars)


def code_chats(sources: Iterable[str] = ("stdlib", "sharegpt"), exclude: Iterable[str] = (), min_line_chars: int = 30,
               stats: dict | None = None) -> Iterator[list[dict]]:
    """Code chats from ``sources``, without those sharing a line with ``exclude``.

    A source is ``"stdlib"``, ``"sharegpt"`` (conversations whose answer has a code block) or
    ``"package:NAME"`` (documented functions of an installed package). ``stats``, where given,
    receives per source the chats kept, those dropped for overlap and the licence."""
    lines = prompt_lines(exclude, min_line_chars)
    stats = {} if stats is None else stats
    for source in sources:
        if source == "stdlib":
            licence = "PSF-2.0"
            chats: Iterable[list[dict]] = (function_chat(fn, i) for i, fn in enumerate(stdlib_functions()))
        elif source == "sharegpt":
            from ..data import sharegpt_chats

            licence = "the ShareGPT dump's terms (as for the chat drafters)"
            chats = (m for m in sharegpt_chats() if has_code_block(m))
        elif source.startswith("package:"):
            name = source.split(":", 1)[1]
            licence = package_licence(name)
            chats = (function_chat(fn, i) for i, fn in enumerate(source_functions(package_root(name), name)))
        else:
            raise ValueError(f"unknown code source {source!r}: choose from 'stdlib', 'sharegpt', 'package:NAME'")
        counts = stats.setdefault(source, {"kept": 0, "overlapping": 0, "licence": licence})
        for messages in chats:
            if overlaps(messages, lines, min_line_chars):
                counts["overlapping"] += 1
                continue
            counts["kept"] += 1
            yield messages
