"""Dataset loaders: record counts, fields, fixed selections, local files, clear errors."""

import json

import pytest

from hf_jetspec.data import MissingDatasetError, iter_sharegpt, load_eval_prompts, sharegpt_chats


@pytest.mark.parametrize("name,count,turns", [
    ("gsm8k", 1319, 1), ("humaneval", 164, 1), ("mt-bench", 80, 2), ("mt-bench-code-reasoning", 20, 2), ("aime25", 30, 1), ("gpqa", 198, 1),
    ("continuation", 243, 1),
])
def test_eval_sets(name, count, turns):
    prompts = load_eval_prompts(name)
    assert len(prompts) == count and len({p.id for p in prompts}) == count
    assert all(len(p.turns) == turns and all(isinstance(t, str) and t.strip() for t in p.turns) for p in prompts)
    first = load_eval_prompts(name, limit=5)
    assert first == prompts[:5] == load_eval_prompts(name, limit=5)  # fixed, seeded selection
    assert load_eval_prompts(name, limit=5, seed=1) != first
    assert load_eval_prompts(name, limit=3, offset=5) == prompts[5:8]


def test_mt_bench_code_reasoning_is_the_coding_and_reasoning_questions():
    subset = load_eval_prompts("mt-bench-code-reasoning")
    assert sorted(p.meta["category"] for p in subset) == ["coding"] * 10 + ["reasoning"] * 10
    assert {p.id for p in subset} <= {p.id for p in load_eval_prompts("mt-bench")}


def test_continuation_prompts_are_plain_text_openings():
    import torch

    from hf_jetspec.data import prompt_input_ids

    prompts = load_eval_prompts("continuation")
    assert all(p.meta["plain_text"] for p in prompts)
    assert sum(p.id.startswith("continuation-doc-") for p in prompts) == 79  # one per Python reference section
    doc = next(p for p in prompts if p.id == "continuation-doc-assert")
    assert doc.turns[0].startswith('The "assert" statement') and doc.turns[0].endswith("\n\n") and len(doc.turns[0]) >= 400
    code = next(p for p in prompts if p.id == "continuation-code-0")
    assert code.turns[0].lstrip().startswith("from typing import List") and "Complete the following" not in code.turns[0]

    class Tokenizer:  # has a chat template, which a continuation prompt must not use
        chat_template = "{{ messages }}"

        def __call__(self, text, return_tensors):
            return {"input_ids": torch.tensor([[len(text)]])}

        def apply_chat_template(self, *args, **kwargs):
            raise AssertionError("a plain-text prompt went through the chat template")

    messages = [{"role": "user", "content": doc.turns[0]}]
    assert prompt_input_ids(Tokenizer(), doc, messages).tolist() == [[len(doc.turns[0])]]


def test_humaneval_prompt_contains_the_signature():
    p = load_eval_prompts("humaneval", limit=1)[0]
    assert "def " in p.turns[0] and p.id.startswith("HumanEval/")


def test_local_jsonl(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "a"}, {"messages": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "c"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = sorted(load_eval_prompts(str(path)), key=lambda p: p.id)
    assert [p.turns for p in prompts] == [("a",), ("b", "c")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "no"}) + "\n")
    with pytest.raises(ValueError, match="expected a 'prompt', 'messages' or 'turns' field"):
        load_eval_prompts(str(bad))


@pytest.mark.parametrize("name", ["mbpp", "math-500", "livecodebench"])
def test_unavailable_sets_say_so(name):
    with pytest.raises(MissingDatasetError, match="not available from any installable package"):
        load_eval_prompts(name)
    with pytest.raises(ValueError, match="unknown prompt set"):
        load_eval_prompts("nosuchset")


def test_sharegpt_salvage():
    convs = list(iter_sharegpt())
    assert len(convs) == 17671  # every complete object before the cut
    starts = [c for c in convs if len(c["conversations"]) > 1 and c["conversations"][0]["from"] == "human" and c["conversations"][1]["from"] == "gpt"]
    assert len(starts) == 11135
    chats = list(sharegpt_chats())
    assert len(chats) == 11128  # those whose first exchange has non-empty text
    assert all(c[0]["role"] == "user" and c[1]["role"] == "assistant" for c in chats[:100])


def test_sharegpt_from_a_truncated_local_file(tmp_path):
    path = tmp_path / "cut.json"
    good = [{"id": "1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
            {"id": "2", "conversations": [{"from": "gpt", "value": "starts with the model"}]}]
    path.write_text(json.dumps(good)[:-1] + ', {"id": "3", "conversations": [{"from": "hu')
    assert [c["id"] for c in iter_sharegpt(path)] == ["1", "2"]
    assert list(sharegpt_chats(path)) == [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]]


class CharTokenizer:
    """One token per ``width`` characters: cuts can be checked by hand (``width=1``: token counts are
    character counts), and ``width=4`` is about as many characters per token as a real tokenizer."""

    def __init__(self, width: int = 1):
        self.width, self.pieces = width, {}

    def __call__(self, text, add_special_tokens=False):
        chunks = [text[i : i + self.width] for i in range(0, len(text), self.width)]
        return {"input_ids": [self.pieces.setdefault(c, len(self.pieces)) for c in chunks]}

    def decode(self, ids):
        names = {i: c for c, i in self.pieces.items()}
        return "".join(names[i] for i in ids)


def test_long_set_names():
    from hf_jetspec.data.long_prompts import parse_long_set

    assert parse_long_set("long-2k") == (("chat", "code"), 2048)
    assert parse_long_set("LONG-code-8k") == (("code",), 8192)
    assert parse_long_set("long-chat-4k") == (("chat",), 4096)
    assert parse_long_set("long-16k") is None and parse_long_set("gsm8k") is None


def test_cut_to_tokens_ends_a_line_within_the_budget():
    from hf_jetspec.data.long_prompts import cut_to_tokens

    text = "abcdefghijklmnopqrstuvwxyz\nab cd\n"
    tok = CharTokenizer()
    assert cut_to_tokens(tok, text, 100) == text
    assert cut_to_tokens(tok, text, 28) == text[:26]  # the line end after the alphabet is within the last tenth of 28
    assert cut_to_tokens(tok, text, 32) == text[:29]  # no line end in the last tenth: the last word end
    assert cut_to_tokens(tok, text, 20) == text[:20]  # neither: the plain token cut


def test_first_function_is_one_the_code_uses_again():
    from hf_jetspec.data.long_prompts import first_function

    code = "def once():\n    pass\n\ndef twice(x):\n    return x\n\ny = twice(1)\n"
    assert first_function(code) == "twice"
    assert first_function("def lone():\n    pass\n") == "lone"
    with pytest.raises(ValueError, match="defines no function"):
        first_function("x = 1\n")


def test_long_sets_cut_their_documents_and_keep_them_across_sizes():
    from hf_jetspec.data.long_prompts import DOC_MARGIN, long_prompts

    tok = CharTokenizer(width=4)
    small, large = long_prompts("long-2k", tok), long_prompts("long-4k", tok)
    assert [p.id for p in small] == [f"long-{k}-2k-{t}" for k, t in
                                    [("chat", "summary"), ("chat", "points"), ("chat", "quote"),
                                     ("code", "type-hints"), ("code", "docstrings"), ("code", "rename")]]
    for a, b in zip(small, large):
        doc_a, doc_b = a.turns[0].rsplit("\n\n", 1)[0], b.turns[0].rsplit("\n\n", 1)[0]
        assert len(doc_a.removeprefix("```python\n").removesuffix("\n```")) <= 4 * (2048 - DOC_MARGIN)
        assert doc_b.startswith(doc_a.removesuffix("\n```"))  # the same document, cut later
    assert {p.meta["sharegpt_index"] for p in small if p.meta["kind"] == "chat"} == {
        p.meta["sharegpt_index"] for p in large if p.meta["kind"] == "chat"}
    # past the first 4,000 qualifying chats (file index 6,388) that the shipped SmolLM2 drafter's last stint read
    assert min(p.meta["sharegpt_index"] for p in small if p.meta["kind"] == "chat") > 6388
    rename = small[-1].turns[0]
    name = rename.split("Rename the function `")[1].split("`")[0]
    assert f"def {name}(" in rename
    assert {p.id for p in load_eval_prompts("long-code-2k", tokenizer=tok)} == {p.id for p in small if p.meta["kind"] == "code"}
    with pytest.raises(ValueError, match="pass tokenizer="):
        load_eval_prompts("long-2k")


@pytest.mark.slow
def test_long_sets_fit_the_smollm2_context(smollm2):
    from hf_jetspec.data import chat_input_ids
    from hf_jetspec.data.long_prompts import SIZES

    _, tokenizer = smollm2
    for tag, size in SIZES.items():
        lengths = [chat_input_ids(tokenizer, p.turns[0]).shape[1] for p in load_eval_prompts(f"long-{tag}", tokenizer=tokenizer)]
        assert all(size - 400 < n <= size - 128 for n in lengths), (tag, lengths)
