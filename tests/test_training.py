"""Trainer mechanics on a tiny target: every label mode trains; rollouts equal greedy generation."""

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.training import JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.corpus import CorpusCollator
from hf_jetspec.training.labels import inherited_slots, ira_offsets
from hf_jetspec.training.rollout import greedy_rollouts, rollout_attention_mask


def test_rollouts_equal_greedy_generation(llama_target):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding
    anchors = torch.tensor([[3, 10, 15], [5, 9, 12]])
    with torch.no_grad():
        out = llama_target(ids, attention_mask=mask, use_cache=True)
        ro = greedy_rollouts(llama_target, out, anchors, 4, [1, 2])
    assert ro.tokens.shape == (2, 3, 5) and ro.logits.shape == (2, 3, 5, 128) and ro.states.shape == (2, 3, 4, 128)
    for b in range(2):
        for j in range(3):
            a = int(anchors[b, j])
            ref = llama_target.generate(ids[b : b + 1, : a + 1], do_sample=False, max_new_tokens=5, output_logits=True, return_dict_in_generate=True)
            assert torch.equal(ref.sequences[0, a + 1 :], ro.tokens[b, j])
            assert torch.allclose(torch.stack(ref.logits, 1)[0], ro.logits[b, j], atol=1e-4)


def test_rollout_mask():
    m = rollout_attention_mask(torch.tensor([[1, 2]]), 4, 2)[0, 0].int().tolist()
    # columns: corpus 0..3, step-1 slots (a0, a1), step-2 slots (a0, a1)
    assert m == [[1, 1, 0, 0, 1, 0, 1, 0], [1, 1, 1, 0, 0, 1, 0, 1]]


def test_ira_offsets_and_inherited_slots():
    j = ira_offsets(1000, 15, torch.Generator().manual_seed(0))
    assert j.min() == 2 and j.max() == 14
    idx, valid = inherited_slots(torch.tensor([2, 13]), 15)
    assert idx[0, :3].tolist() == [2, 3, 4] and valid[0].sum() == 13  # slots 1..13 inherit primary slots 3..15
    assert valid[1].tolist() == [True, True] + [False] * 13


def corpus(n=24, length=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 128, (length - (i % 5),), generator=g).tolist(), "response_start": 6} for i in range(n)]


@pytest.mark.parametrize("labels", ["corpus", "erase", "alr", "alr+ira"])
def test_each_label_mode_trains(tmp_path, llama_target, labels):
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target)
    args = JetSpecTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=25, learning_rate=3e-3, report_to=[],
        logging_steps=5, save_steps=1000, block_size=6, blocks_per_sequence=6, labels=labels, use_cpu=True,
    )
    trainer = JetSpecTrainer(model=drafter, args=args, target=llama_target, train_dataset=corpus(), data_collator=CorpusCollator(0))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert any("tau_est" in h for h in trainer.state.log_history)


def test_missing_target_is_an_error(tmp_path, llama_target):
    args = JetSpecTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="needs the frozen target"):
        JetSpecTrainer(model=JetSpecDrafter.for_target(llama_target), args=args)
    with pytest.raises(ValueError, match="labels must be one of"):
        JetSpecTrainingArguments(output_dir=str(tmp_path), labels="magic")
