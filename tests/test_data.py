"""Dataset loaders: record counts, fields, fixed selections, local files, clear errors."""

import json

import pytest

from hf_jetspec.data import MissingDatasetError, iter_sharegpt, load_eval_prompts, sharegpt_chats


@pytest.mark.parametrize("name,count,turns", [
    ("gsm8k", 1319, 1), ("humaneval", 164, 1), ("mt-bench", 80, 2), ("mt-bench-code-reasoning", 20, 2), ("aime25", 30, 1),
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
