"""Regeneration: the target's own answers, with the feature cache written by the generation forwards."""

from __future__ import annotations

import json

import pytest
import torch

from hf_jetspec.training import FeatureCacheDataset
from hf_jetspec.training.feature_cache import next_token_logprobs
from hf_jetspec.training.regenerate import (
    MANIFEST_NAME,
    RegenerationConfig,
    RegenerationPrompt,
    generate_with_features,
    regenerate,
    regeneration_prompts,
)

LAYERS = [0, 2]
PROMPTS = [[1, 5, 9, 3, 7], [4, 4, 8], [2, 11, 6, 6, 13, 9, 1], [17, 3], [5, 5, 5, 12]]


class CharTokenizer:
    """A chat template over characters: enough for the prompt selection logic."""

    pad_token_id = 0
    chat_template = "<u>{content}<a>"

    def apply_chat_template(self, messages, add_generation_prompt=True, return_tensors=None, return_dict=False):
        return {"input_ids": torch.tensor([[ord(c) % 97 for c in "<u>" + messages[0]["content"] + "<a>"]])}


class BaseModelTokenizer:
    """A base model's tokenizer: no chat template, plain text."""

    pad_token_id = 0
    chat_template = None

    def __call__(self, text, return_tensors=None):
        return {"input_ids": torch.tensor([[ord(c) % 97 for c in text]])}


def teacher_forced(target, tokens):
    with torch.no_grad():
        out = target(torch.tensor([tokens]), output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in LAYERS], -1)[0]
    return out, states


def test_generated_answers_and_features_match_plain_generation_and_a_teacher_forced_pass(llama_target):
    """Left-padded batch generation gives each prompt the target's own greedy answer, and the features
    recorded on the way equal those of one forward over the finished sequence."""
    items = generate_with_features(llama_target, PROMPTS[:3], [False] * 3, LAYERS, max_new_tokens=12, top_k=8, temperature=1.0,
                                   eos_ids=set(), pad_id=0, states_dtype=torch.float32)
    for prompt, item in zip(PROMPTS[:3], items):
        ref = llama_target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)[0]
        assert item["input_ids"].tolist() == ref.tolist() and int(item["response_start"]) == len(prompt)
        out, states = teacher_forced(llama_target, ref.tolist())
        assert torch.allclose(item["states"], states, atol=1e-4)
        top = torch.log_softmax(out.logits[0].float(), -1).topk(8, dim=-1)
        assert torch.equal(item["topk_ids"].long(), top.indices)
        assert torch.allclose(item["topk_logprobs"].float(), top.values, atol=2e-3)
        assert torch.allclose(item["next_logprob"], next_token_logprobs(out.logits, ref[None])[0], atol=1e-4)


def test_a_row_stops_after_its_eos_and_keeps_its_state(llama_target):
    free = generate_with_features(llama_target, PROMPTS[:2], [False, False], LAYERS, 10, 4, 1.0, set(), 0, torch.float32)
    eos = int(free[0]["input_ids"][len(PROMPTS[0]) + 2])  # row 0's third answer token
    stopped = generate_with_features(llama_target, PROMPTS[:2], [False, False], LAYERS, 10, 4, 1.0, {eos}, 0, torch.float32)
    row = stopped[0]["input_ids"].tolist()
    first = row.index(eos, len(PROMPTS[0]))
    assert row == free[0]["input_ids"].tolist()[: first + 1]  # cut right after the first EOS
    assert stopped[0]["states"].shape[0] == len(row) and stopped[0]["next_logprob"].shape[0] == len(row)
    _, states = teacher_forced(llama_target, row)
    assert torch.allclose(stopped[0]["states"], states, atol=1e-4)


def test_finished_rows_leave_the_batch_and_unneeded_left_padding_is_cut(llama_target, monkeypatch):
    """The longest prompt's row stops first: it leaves the batch, the padding columns only it needed are
    cut from the mask and the cache, and every other row still gets what it gets answered alone."""
    import hf_jetspec.training.regenerate as regenerate_module

    prompts = [PROMPTS[2], PROMPTS[1], PROMPTS[3]]  # 7, 3 and 2 tokens: rows 1 and 2 are left-padded
    free = generate_with_features(llama_target, prompts[:1], [False], LAYERS, 10, 4, 1.0, set(), 0, torch.float32)
    eos = int(free[0]["input_ids"][len(prompts[0])])  # the long row's first answer token ends it
    widths = []
    drop = regenerate_module._drop_finished_rows

    def spy(cache, keep, mask, *rest):
        out = drop(cache, keep, mask, *rest)
        widths.append((len(keep), mask.shape[1], out[0].shape[1], cache.get_seq_length()))
        return out

    monkeypatch.setattr(regenerate_module, "_drop_finished_rows", spy)
    batch = generate_with_features(llama_target, prompts, [False] * 3, LAYERS, 10, 4, 1.0, {eos}, 0, torch.float32)
    assert widths and widths[0][0] < 3 and widths[0][2] < widths[0][1] and widths[0][2] == widths[0][3]
    for prompt, item in zip(prompts, batch):
        alone = generate_with_features(llama_target, [prompt], [False], LAYERS, 10, 4, 1.0, {eos}, 0, torch.float32)[0]
        assert item["input_ids"].tolist() == alone["input_ids"].tolist()
        for key in ("states", "topk_logprobs", "next_logprob"):
            assert torch.allclose(item[key].float(), alone[key].float(), atol=1e-4), key
        assert torch.equal(item["topk_ids"], alone["topk_ids"])


def test_sampled_rows_follow_the_temperature_and_greedy_rows_do_not_move(llama_target):
    torch.manual_seed(0)
    a = generate_with_features(llama_target, PROMPTS[:2], [True, False], LAYERS, 16, 4, 5.0, set(), 0, torch.float32)
    torch.manual_seed(1)
    b = generate_with_features(llama_target, PROMPTS[:2], [True, False], LAYERS, 16, 4, 5.0, set(), 0, torch.float32)
    assert not torch.equal(a[0]["input_ids"], b[0]["input_ids"])  # sampled at a high temperature: the draws differ
    assert torch.equal(a[1]["input_ids"], b[1]["input_ids"])  # greedy


def test_regenerate_writes_a_resumable_cache_with_its_manifest(llama_target, tmp_path):
    config = RegenerationConfig(num_prompts=5, max_new_tokens=6, batch_size=2, top_k=4, shard_sequences=2, states_dtype="float16")
    prompts = [RegenerationPrompt("sharegpt", p, f"h{i}") for i, p in enumerate(PROMPTS)]
    full = regenerate(llama_target, CharTokenizer(), tmp_path / "full", LAYERS, config, "tiny", prompts, progress=False)
    assert full.num_sequences == 5 and full.greedy == 5 and full.generated_tokens == 5 * 6 and full.tokens_per_s > 0
    manifest = json.loads((tmp_path / "full" / MANIFEST_NAME).read_text())
    assert manifest["prompts_sha256"] == [f"h{i}" for i in range(5)] and manifest["target"] == "tiny"
    data = FeatureCacheDataset(tmp_path / "full")
    assert len(data) == 5 and len(data.info.shards) == 3
    assert data[1]["input_ids"][: len(PROMPTS[1])].tolist() == PROMPTS[1] and data[1]["response_start"] == len(PROMPTS[1])

    # a run stopped after three prompts, then resumed with all five
    part = regenerate(llama_target, CharTokenizer(), tmp_path / "part", LAYERS, config, "tiny", prompts[:3], progress=False)
    assert part.num_sequences == 3
    resumed = regenerate(llama_target, CharTokenizer(), tmp_path / "part", LAYERS, config, "tiny", prompts, resume=True, progress=False,
                         machine={"cpu": "test CPU (2 cores)"})
    assert resumed.num_sequences == 5
    # the manifest's counts agree with what the resumed cache holds, and with the uninterrupted run's
    saved = json.loads((tmp_path / "part" / MANIFEST_NAME).read_text())
    cache = FeatureCacheDataset(tmp_path / "part")
    assert saved["num_sequences"] == len(cache) == saved["greedy"] + saved["sampled"] == cache.info.num_sequences
    assert saved["generated_tokens"] == sum(len(x["input_ids"]) - x["response_start"] for x in cache) == full.generated_tokens
    assert saved["prompts_sha256"] == manifest["prompts_sha256"]
    # each run records where it started and on what machine
    assert saved["stints"] == [{"first": 0}, {"first": 3, "cpu": "test CPU (2 cores)"}]
    # CPU time adds up over stints: the cost axis of recipe comparisons
    assert 0 < part.cpu_seconds < resumed.cpu_seconds and resumed.cpu_seconds_from == 0
    # and is recorded at every flush (a shard of 2, the stop at 3, the resumed shard of 3-4), so the first N answers are priced where they were made
    marks = {int(n): c for n, c in saved["cpu_seconds_at"].items()}
    assert sorted(marks) == [2, 3, 5] and marks[3] == pytest.approx(part.cpu_seconds, abs=0.01)
    assert marks[5] == pytest.approx(resumed.cpu_seconds, abs=0.01) and marks[2] <= marks[3] <= marks[5]
    again = FeatureCacheDataset(tmp_path / "part")
    first = FeatureCacheDataset(tmp_path / "part", max_sequences=3)  # the cache as it was before it grew
    assert len(first) == 3 and torch.equal(first[2]["input_ids"], again[2]["input_ids"])
    with pytest.raises(ValueError, match="holds 5 sequences"):
        FeatureCacheDataset(tmp_path / "part", max_sequences=6)
    for i in range(5):
        assert torch.equal(again[i]["input_ids"], data[i]["input_ids"])
        # batches are composed differently (padding), so states agree to rounding
        assert torch.allclose(again[i]["states"].float(), data[i]["states"].float(), atol=2e-3)
    with pytest.raises(FileExistsError, match="--resume"):
        regenerate(llama_target, CharTokenizer(), tmp_path / "full", LAYERS, config, "tiny", prompts, progress=False)
    other = RegenerationConfig(num_prompts=5, max_new_tokens=7, batch_size=2, top_k=4, shard_sequences=2)
    with pytest.raises(ValueError, match="cannot resume"):
        regenerate(llama_target, CharTokenizer(), tmp_path / "full", LAYERS, other, "tiny", prompts, resume=True, progress=False)


def test_float8_states_halve_the_cache_and_read_back_within_e4m3_rounding(llama_target, tmp_path):
    """states_dtype="float8_e4m3fn": one scale per layer and token, 8-bit values, bf16 on reading,
    within e4m3's relative step (1/16 of each layer slice's largest magnitude) of the 16-bit cache's."""
    prompts = [RegenerationPrompt("sharegpt", p, f"h{i}") for i, p in enumerate(PROMPTS[:3])]
    runs = {}
    for storage in ("float16", "float8_e4m3fn"):
        config = RegenerationConfig(num_prompts=3, max_new_tokens=5, batch_size=3, top_k=4, states_dtype=storage)
        regenerate(llama_target, CharTokenizer(), tmp_path / storage, LAYERS, config, "tiny", prompts, progress=False)
        runs[storage] = FeatureCacheDataset(tmp_path / storage)
    assert runs["float8_e4m3fn"].info.states_storage == "float8_e4m3fn" and runs["float16"].info.states_storage == ""
    size = {k: sum(f.stat().st_size for f in (tmp_path / k).glob("features-*")) for k in runs}
    assert size["float8_e4m3fn"] < size["float16"]
    hidden = llama_target.config.hidden_size
    for i in range(3):
        exact, stored = runs["float16"][i]["states"].float(), runs["float8_e4m3fn"][i]["states"]
        assert stored.dtype == torch.bfloat16 and torch.equal(runs["float16"][i]["input_ids"], runs["float8_e4m3fn"][i]["input_ids"])
        peak = exact.view(len(exact), len(LAYERS), hidden).abs().amax(-1, keepdim=True)
        assert ((stored.float() - exact).view(len(exact), len(LAYERS), hidden).abs() <= peak / 16 + 1e-3).all()
    one_layer = FeatureCacheDataset(tmp_path / "float8_e4m3fn", layer_ids=[2])  # a column subset after dequantising
    assert torch.equal(one_layer[0]["states"], runs["float8_e4m3fn"][0]["states"][:, hidden:])
    with pytest.raises(ValueError, match="states_dtype must be one of"):
        RegenerationConfig(states_dtype="int8")


def test_prompt_selection_excludes_evaluation_overlap_repeats_and_long_prompts(monkeypatch):
    import hf_jetspec.training.regenerate as regen

    evaluation = "Natalia sold clips to 48 of her friends in April, and then"
    turns = {
        "sharegpt": ["hello there", "hello there", f"please solve:\n{evaluation}", "x" * 400, "write a poem", "tell me a joke"],
        "code": ["def f(): pass  # add docstrings", "sort a list", "reverse a string"],
    }
    monkeypatch.setattr(regen, "_source_turns", lambda source: iter(turns[source]))
    config = RegenerationConfig(num_prompts=5, max_prompt_tokens=64, sampled_share=0.4)
    prompts, stats = regeneration_prompts(CharTokenizer(), config, exclude={evaluation})
    texts = [p.source for p in prompts]
    assert texts == ["sharegpt", "code", "sharegpt", "code", "sharegpt"]  # taken in turn
    assert stats["sharegpt"] == {"prompts": 3, "overlapping": 1, "repeats": 1, "too_long": 1, "context_cut": 0}
    assert stats["code"]["prompts"] == 2
    assert sum(p.sampled for p in prompts) == 2  # 40% of 5, spread over the run
    assert len({p.sha256 for p in prompts}) == 5
    plain, _ = regeneration_prompts(BaseModelTokenizer(), config, exclude={evaluation})  # a base model: the text alone
    assert plain[0].input_ids == [ord(c) % 97 for c in "hello there"] and prompts[0].input_ids[:3] == [ord(c) % 97 for c in "<u>"]
    with pytest.raises(ValueError, match="unknown regeneration source"):
        RegenerationConfig(sources=("gsm8k-test",))
    with pytest.raises(ValueError, match="temperature"):
        RegenerationConfig(sampled_share=0.5, temperature=0.0)


def test_a_prompt_selection_is_kept_and_read_back_only_for_the_same_selection(monkeypatch, tmp_path):
    import hf_jetspec.training.regenerate as regen

    turns = {"sharegpt": ["hello there", "write a poem", "tell me a joke"], "code": ["sort a list", "reverse a string"]}
    monkeypatch.setattr(regen, "_source_turns", lambda source: iter(turns[source]))
    config = RegenerationConfig(num_prompts=4, max_prompt_tokens=64, sampled_share=0.5)
    first, stats = regen.selected_prompts(CharTokenizer(), config, tmp_path, exclude=set())
    assert (tmp_path / regen.PROMPTS_NAME).is_file()
    calls = []
    monkeypatch.setattr(regen, "regeneration_prompts", lambda *a: calls.append(a) or ([], {}))
    again, again_stats = regen.selected_prompts(CharTokenizer(), config, tmp_path, exclude=set())
    assert again == first and again_stats == stats and not calls  # read back, not selected again
    regen.selected_prompts(CharTokenizer(), config, tmp_path, exclude={"a new evaluation line of thirty characters"})
    regen.selected_prompts(CharTokenizer(), RegenerationConfig(num_prompts=5, max_prompt_tokens=64), tmp_path, exclude=set())
    regen.selected_prompts(BaseModelTokenizer(), config, tmp_path, exclude=set())
    assert len(calls) == 3  # other evaluation lines, another count, another tokenizer: selected again


def test_every_installed_evaluation_prompt_is_excluded_by_the_line_rule():
    from hf_jetspec.data import load_eval_prompts
    from hf_jetspec.training.code_corpus import overlaps
    from hf_jetspec.training.regenerate import evaluation_lines

    lines = evaluation_lines()
    for name in ("gsm8k", "humaneval", "mt-bench"):
        for prompt in load_eval_prompts(name, limit=20):
            text = prompt.turns[0]
            if any(len(line.strip()) >= 30 for line in text.splitlines()):
                assert overlaps([{"content": text}], lines), (name, prompt.id)


def test_a_deadline_stops_between_batches_and_resume_goes_on(llama_target, tmp_path):
    """A spent deadline still answers the first batch of an empty cache (setup may eat a small
    budget on a slow machine), then stops; resume goes on from the next prompt."""
    import time

    config = RegenerationConfig(num_prompts=5, max_new_tokens=4, batch_size=2, top_k=4, shard_sequences=2, states_dtype="float16")
    prompts = [RegenerationPrompt("sharegpt", p, f"h{i}") for i, p in enumerate(PROMPTS)]
    stopped = regenerate(llama_target, CharTokenizer(), tmp_path / "r", LAYERS, config, "tiny", prompts, progress=False,
                         deadline=time.perf_counter())
    assert stopped.num_sequences == 2 and stopped.generated_tokens > 0
    again = regenerate(llama_target, CharTokenizer(), tmp_path / "r", LAYERS, config, "tiny", prompts, resume=True, progress=False,
                       deadline=time.perf_counter())
    assert again.num_sequences == 2  # a cache with data honours the deadline at once
    resumed = regenerate(llama_target, CharTokenizer(), tmp_path / "r", LAYERS, config, "tiny", prompts, resume=True, progress=False)
    assert resumed.num_sequences == 5 and len(FeatureCacheDataset(tmp_path / "r")) == 5


def test_later_turns_carry_the_conversation_so_far(monkeypatch):
    """``sharegpt-turns``: every later user turn of a conversation, after the earlier turns and the
    dataset's answers; the overlap rule reads every message of the context."""
    import hf_jetspec.data as data
    import hf_jetspec.training.regenerate as regen

    chat = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"}, {"role": "assistant", "content": "a3"}]
    monkeypatch.setattr(data, "sharegpt_chats", lambda max_turns=1: iter([chat, chat[:2]]))
    later = list(regen._later_turns())
    assert later == [chat[:3], chat[:5]]  # the one-exchange conversation has no later turn
    monkeypatch.setattr(regen, "_source_turns", lambda source: iter(later))

    class ChatTokenizer(CharTokenizer):
        def apply_chat_template(self, messages, add_generation_prompt=True, return_tensors=None, return_dict=False):
            text = "".join(f"<{m['role'][0]}>{m['content']}" for m in messages) + "<a>"
            return {"input_ids": torch.tensor([[ord(c) % 97 for c in text]])}

    config = RegenerationConfig(sources=("sharegpt-turns",), num_prompts=5, max_prompt_tokens=200)
    prompts, stats = regeneration_prompts(ChatTokenizer(), config, exclude=set())
    assert len(prompts) == 2 and stats["sharegpt-turns"]["prompts"] == 2
    assert len(prompts[1].input_ids) > len(prompts[0].input_ids)  # the longer context
    blocked, stats = regeneration_prompts(ChatTokenizer(), config, exclude={"a2"})
    assert len(blocked) == 2  # lines under 30 characters never overlap
    # a conversation longer than the prompt limit keeps its newest exchanges that fit, the last user turn always
    short = RegenerationConfig(sources=("sharegpt-turns",), num_prompts=5, max_prompt_tokens=len("<u>q2<a>a2<u>q3<a>"))
    cut, stats = regeneration_prompts(ChatTokenizer(), short, exclude=set())
    assert [p.input_ids for p in cut] == [prompts[0].input_ids, [ord(c) % 97 for c in "<u>q2<a>a2<u>q3<a>"]]
    assert stats["sharegpt-turns"]["context_cut"] == 1
