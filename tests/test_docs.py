"""Every Python block of README.md and the guide (docs/*.md) runs, page by page, on tiny test targets.

A page's blocks run in order in one namespace, so a later block may use what an earlier one made.
The names the guide's blocks take for granted (``target``, ``tokenizer``, ``input_ids``,
``inputs``, ``drafter``, ``path``, ``workload``) are set up first, on a tiny Llama target; real
models and shipped folders go through the one substitution below. A changed API fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import BatchEncoding, PreTrainedModel

import hf_jetspec
from hf_jetspec import JetSpecDrafter
from hf_jetspec.drafter.dflash_format import jetspec_to_dflash
from hf_jetspec.foresight import LayerSkipAdapter
from hf_jetspec.tools import targets
from hf_jetspec.tools.testing import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# ================================ THE SUBSTITUTION ================================
# The docs name real models and shipped folders; here every block runs on a tiny random Llama
# (``load_target`` of any name returns it, with a character tokenizer), and these strings are
# replaced in the block's text, longest first. ``push_to_hub`` records its call (no Hub here).
REAL_TO_TINY = {
    "hub_cards/jetspec-smollm2-135m-foresight-layerskip": "{layerskip}",
    "hub_cards/jetspec-smollm2-135m": "{drafter}",
    "hub_cards/jetspec-qwen2.5-coder-1.5b": "{drafter}",
    "path/to/dflash-or-muse-glimmer-folder": "{dflash}",
    '"0-9,20-27"': '"0-1"',  # a layer subset of SmolLM2's 30 layers -> of the tiny target's 4
    "max_new_tokens=256": "max_new_tokens=12",
    "max_new_tokens=64": "max_new_tokens=12",
    "compiled_rounds=True": 'compiled_rounds=True, compile_backend="aot_eager"',  # the same graphs, traced without generating code
}
# ==================================================================================


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


def substitute(code: str, folders: dict[str, str]) -> str:
    for real in sorted(REAL_TO_TINY, key=len, reverse=True):
        code = code.replace(real, REAL_TO_TINY[real].format(**folders))
    return code


class CharTokenizer:
    """Enough of a tokenizer for the docs' blocks: text -> ids within the tiny target's vocabulary."""

    pad_token_id = 0
    padding_side = "right"

    def __call__(self, text, return_tensors=None, padding=False):
        texts = [text] if isinstance(text, str) else list(text)
        rows = [[3 + ord(c) % 120 for c in t] for t in texts]
        width = max(map(len, rows))
        if len(rows) > 1 and not padding and len(set(map(len, rows))) > 1:
            raise ValueError("texts of different lengths need padding=True")
        ids = torch.full((len(rows), width), self.pad_token_id)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(rows):
            cols = slice(width - len(r), width) if self.padding_side == "left" else slice(0, len(r))
            ids[b, cols], mask[b, cols] = torch.tensor(r), 1
        return BatchEncoding({"input_ids": ids, "attention_mask": mask})

    def decode(self, ids, **kwargs):
        return "".join(chr(97 + int(i) % 26) for i in ids)


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    """The tiny target and the folders the substitution points to."""
    tmp = tmp_path_factory.mktemp("docs")
    target = tiny_llama()
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(target)
    drafter.save_pretrained(tmp / "drafter")
    LayerSkipAdapter.for_drafter(drafter, "0-1").save_pretrained(tmp / "layerskip")
    dflash = JetSpecDrafter.for_target(target, attention="bidirectional", block_inputs="mask", mask_token_id=3, qk_norm=True,
                                       context_input_norm=False, row_predicts="self", target_layer_ids=[0, 2], block_size=8)
    from safetensors.torch import save_file

    state, cfg = jetspec_to_dflash(dflash.state_dict(), dflash.config)
    (tmp / "dflash").mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "dflash" / "model.safetensors"))
    (tmp / "dflash" / "config.json").write_text(json.dumps(cfg))
    return target, {name: str(tmp / name) for name in ("drafter", "layerskip", "dflash")}


def namespace(target, folders: dict) -> dict:
    tokenizer = CharTokenizer()
    enc = tokenizer("def add(a, b):\n    return a + b\n\ndef add(")
    return {
        "target": target, "tokenizer": tokenizer, "input_ids": enc.input_ids, "inputs": dict(enc),
        "drafter": JetSpecDrafter.from_pretrained(folders["drafter"]), "path": folders["drafter"],
        "workload": [dict(tokenizer(text)) for text in ("abc abc abc", "one two one two")],
    }


def run_page(page: Path, tiny_world, monkeypatch, tmp_path) -> int:
    target, folders = tiny_world
    monkeypatch.chdir(tmp_path)  # blocks that save ("my-drafter") write here
    monkeypatch.setattr(hf_jetspec, "load_target", lambda *a, **k: (target, CharTokenizer()))
    monkeypatch.setattr(targets, "load_target", lambda *a, **k: (target, CharTokenizer()))
    pushed = []
    monkeypatch.setattr(PreTrainedModel, "push_to_hub", lambda self, repo, *a, **k: pushed.append(repo))
    scope = namespace(target, folders)
    blocks = python_blocks(page.read_text())
    for i, block in enumerate(blocks):
        code = substitute(block, folders)
        try:
            exec(compile(code, f"{page.relative_to(ROOT)} block {i + 1}", "exec"), scope)
        except Exception as e:
            raise AssertionError(f"{page.relative_to(ROOT)}, Python block {i + 1} fails: {type(e).__name__}: {e}\n{block}") from e
    return len(blocks)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_python_block_of_the_page_runs(page, tiny_world, monkeypatch, tmp_path):
    run_page(page, tiny_world, monkeypatch, tmp_path)


def test_a_renamed_function_fails_the_front_page(tiny_world, monkeypatch, tmp_path):
    """The check bites: rename what a block calls and the page fails, naming the block."""
    from hf_jetspec import DrafterFreeAssistant

    monkeypatch.delattr(DrafterFreeAssistant, "for_target")
    with pytest.raises(AssertionError, match=r"README.md, Python block 2 fails: AttributeError"):
        run_page(ROOT / "README.md", tiny_world, monkeypatch, tmp_path)


def test_the_front_page_and_the_guide_have_python_blocks_and_the_substitution_is_used():
    texts = "\n".join(p.read_text() for p in PAGES)
    assert len(python_blocks((ROOT / "README.md").read_text())) >= 2
    unused = [real for real in REAL_TO_TINY if real not in texts]
    assert not unused, f"substitutions no page needs any more: {unused}"
