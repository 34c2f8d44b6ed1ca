"""The answer corpus: the target's answers as committed parquet shards, resumed anywhere, trained on with no feature cache."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.training import JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.answer_corpus import (
    MANIFEST,
    AnswerCorpusDataset,
    read_rows,
    read_shard_ranges,
    regenerate_answers,
    selection_digest,
)
from hf_jetspec.training.corpus import CorpusCollator
from hf_jetspec.training.regenerate import RegenerationConfig, RegenerationPrompt

PROMPTS = [[1, 5, 9, 3, 7], [4, 4, 8], [2, 11, 6, 6, 13, 9, 1], [17, 3], [5, 5, 5, 12], [9, 2, 2], [3, 14, 15, 9, 2, 6], [8, 1]]


def selection():
    return [RegenerationPrompt("sharegpt" if i % 2 else "code", p, f"{i:02d}" + "ab" * 31, sampled=i == 5) for i, p in enumerate(PROMPTS)]


def config(**kw):
    return RegenerationConfig(**({"num_prompts": 8, "max_new_tokens": 6, "batch_size": 2, "shard_sequences": 3, "sampled_share": 0.125} | kw))



class Tokenizer:
    pad_token_id = 0


def run(target, folder, prompts=None, **kw):
    prompts = prompts or selection()
    return regenerate_answers(target, Tokenizer(), folder, kw.pop("cfg", config()), "tiny", "tiny/llama@test", prompts=prompts,
                              source_stats={"code": {"prompts": 4}, "sharegpt": {"prompts": 4}}, progress=False, **kw)


def shard_bytes(folder):
    data = os.path.join(folder, "data")
    return {name: open(os.path.join(data, name), "rb").read() for name in sorted(os.listdir(data))}


def test_answers_are_the_targets_greedy_answers_in_shards_with_manifest_and_card(llama_target, tmp_path):
    committed = []
    m = run(llama_target, tmp_path / "c", on_shard=committed.append)
    # 8 rows in shards of 3: [0, 3), [3, 6), [6, 8); on_shard saw each, after the manifest was written
    assert [(a, b) for a, b, _ in read_shard_ranges(tmp_path / "c")] == [(0, 3), (3, 6), (6, 8)]
    assert [os.path.basename(p) for p in committed] == ["train-000000-000003.parquet", "train-000003-000006.parquet",
                                                        "train-000006-000008.parquet"]
    rows = read_rows(tmp_path / "c")
    for i, (prompt, row) in enumerate(zip(PROMPTS, rows)):
        assert row.index == i and row.prompt_tokens == len(prompt) and row.prompt_sha256 == selection()[i].sha256[:16]
        if i != 5:  # greedy rows are the target's own greedy answers
            ref = llama_target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6)[0, len(prompt):]
            assert row.answer_ids == ref.tolist() and not row.sampled and row.temperature == 0.0
    assert rows[5].sampled and rows[5].temperature == pytest.approx(0.7) and len(rows[5].answer_ids) == 6
    saved = json.loads((tmp_path / "c" / MANIFEST).read_text())
    assert saved["rows"] == 8 and saved["greedy"] == 7 and saved["sampled"] == 1 and saved["answer_tokens"] == 48
    assert saved["bytes"] == sum(len(b) for b in shard_bytes(tmp_path / "c").values())
    assert saved["selection_sha256"] == selection_digest(selection()) and saved["revision"] == "tiny/llama@test"
    assert m.cpu_seconds > 0 and saved["stints"][0]["first"] == 0 and saved["stints"][0]["rows"] == 8
    card = (tmp_path / "c" / "README.md").read_text()
    assert "| answers | 8 (7 greedy, 1 sampled at T = 0.7) |" in card and "path: data/*.parquet" in card


def test_a_fresh_checkout_resumes_after_the_committed_shards_and_remakes_none(llama_target, tmp_path):
    """A run stopped by its deadline keeps its whole shards only; a copy of the folder (a fresh clone)
    resumes at the next row; the shards already there are untouched and the result equals one
    uninterrupted run."""
    whole = tmp_path / "whole"
    run(llama_target, whole)
    part = tmp_path / "part"
    # a spent deadline after one batch would leave 2 rows: fewer than a shard, so nothing is kept
    run(llama_target, part, deadline=time.perf_counter())
    assert read_shard_ranges(part) == [] and json.loads((part / MANIFEST).read_text())["rows"] == 0
    run(llama_target, part, cfg=config(num_prompts=3))  # a campaign asked for fewer prompts: one shard
    clone = tmp_path / "clone"
    shutil.copytree(part, clone)
    before = shard_bytes(clone)
    seen = []
    run(llama_target, clone, on_shard=seen.append, machine={"cpu": "test CPU"})
    after = shard_bytes(clone)
    assert all(after[name] == data for name, data in before.items())  # nothing remade
    assert [os.path.basename(p) for p in seen] == ["train-000003-000006.parquet", "train-000006-000008.parquet"]
    greedy = [r for r in read_rows(clone) if not r.sampled]
    assert [r.answer_ids for r in greedy] == [r.answer_ids for r in read_rows(whole) if not r.sampled]
    saved = json.loads((clone / MANIFEST).read_text())
    assert saved["rows"] == 8 and [s["first"] for s in saved["stints"]] == [0, 3] and saved["stints"][-1]["cpu"] == "test CPU"
    # a finished corpus answers nothing more
    assert run(llama_target, clone).rows == 8 and shard_bytes(clone) == after


def test_a_gap_an_overlap_a_stranger_and_a_damaged_shard_are_refused(llama_target, tmp_path):
    folder = tmp_path / "c"
    run(llama_target, folder)
    data = folder / "data"
    os.rename(data / "train-000003-000006.parquet", tmp_path / "moved")
    with pytest.raises(ValueError, match="a gap at row 3"):
        read_shard_ranges(folder)
    with pytest.raises(ValueError, match="a gap"):
        run(llama_target, folder)  # resuming over a hole would skip rows
    os.rename(tmp_path / "moved", data / "train-000003-000006.parquet")
    shutil.copy(data / "train-000003-000006.parquet", data / "train-000004-000006.parquet")
    with pytest.raises(ValueError, match="an overlap"):
        read_shard_ranges(folder)
    os.remove(data / "train-000004-000006.parquet")
    (data / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not an answer shard"):
        read_shard_ranges(folder)
    os.remove(data / "notes.txt")
    (data / "train-000006-000008.parquet").write_bytes(b"PAR1 broken")
    with pytest.raises(ValueError, match="not a readable parquet shard"):
        read_rows(folder)


def test_another_target_options_or_selection_cannot_extend_a_corpus(llama_target, tmp_path):
    folder = tmp_path / "c"
    run(llama_target, folder, cfg=config(num_prompts=3))
    with pytest.raises(ValueError, match="cannot extend"):
        run(llama_target, folder, cfg=config(max_new_tokens=7))
    changed = selection()
    changed[2] = RegenerationPrompt("code", PROMPTS[2], "ff" * 32)
    with pytest.raises(ValueError, match="another prompt selection"):
        run(llama_target, folder, prompts=changed)


def test_datasets_loads_the_corpus_folder(llama_target, tmp_path):
    datasets = pytest.importorskip("datasets")
    run(llama_target, tmp_path / "c")
    ds = datasets.load_dataset(str(tmp_path / "c"), split="train")
    assert len(ds) == 8 and ds[3]["index"] == 3 and ds[3]["answer_ids"] == read_rows(tmp_path / "c")[3].answer_ids


def test_the_trainer_learns_from_committed_shards_with_no_feature_cache(llama_target, tmp_path):
    """A fresh clone holds shards and nothing else: the dataset rebuilds prompt + answer and the
    trainer computes the target's features itself in every step."""
    run(llama_target, tmp_path / "c")
    data = AnswerCorpusDataset(tmp_path / "c", prompts=selection())
    assert len(data) == 8 and data[2]["input_ids"] == PROMPTS[2] + read_rows(tmp_path / "c")[2].answer_ids
    assert data[2]["response_start"] == len(PROMPTS[2])
    assert len(AnswerCorpusDataset(tmp_path / "c", prompts=selection(), limit=5)) == 5
    wrong = selection()
    wrong[4] = RegenerationPrompt("code", PROMPTS[4], "00" * 32)
    with pytest.raises(ValueError, match="row 4"):
        AnswerCorpusDataset(tmp_path / "c", prompts=wrong)
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target)
    args = JetSpecTrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4, learning_rate=3e-3,
                                    report_to=[], logging_steps=1, save_steps=1000, block_size=4, blocks_per_sequence=2, use_cpu=True)
    trainer = JetSpecTrainer(model=drafter, args=args, target=llama_target, train_dataset=data, data_collator=CorpusCollator(0))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert not list((tmp_path / "c").glob("**/*.safetensors"))  # nothing large was written
