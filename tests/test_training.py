"""Trainer mechanics on a tiny target: every label mode trains; rollouts equal greedy generation."""

import math

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.training import JetSpecTrainer, JetSpecTrainingArguments
from hf_jetspec.training.blocks import sample_draft_lengths
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
    assert any("train_tau_est" in h for h in trainer.state.log_history)
    cpu = [h["cpu_hours"] for h in trainer.state.log_history if "cpu_hours" in h]
    assert len(cpu) >= 5 and all(a <= b for a, b in zip(cpu, cpu[1:])) and cpu[-1] > cpu[0] > 0


def test_draft_lengths_for_truncated_blocks():
    g = torch.Generator().manual_seed(0)
    assert sample_draft_lengths(2, 3, 15, 0.0, g).tolist() == [[15] * 3] * 2
    short = sample_draft_lengths(4, 1000, 15, 1.0, g)
    assert short.min() == 1 and short.max() == 14  # every block shorter, every shorter length drawn
    some = sample_draft_lengths(4, 1000, 15, 0.25, g)
    assert abs((some < 15).float().mean().item() - 0.25) < 0.03


def test_truncated_blocks_train_a_bidirectional_drafter_and_refuse_a_causal_one(tmp_path, llama_target):
    torch.manual_seed(0)
    args = JetSpecTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=20, learning_rate=3e-3, report_to=[],
        logging_steps=5, save_steps=1000, block_size=6, blocks_per_sequence=6, use_cpu=True, truncated_blocks=0.5,
    )
    drafter = JetSpecDrafter.for_target(llama_target, attention="bidirectional")
    trainer = JetSpecTrainer(model=drafter, args=args, target=llama_target, train_dataset=corpus(), data_collator=CorpusCollator(0))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="causal drafter"):
        JetSpecTrainer(model=JetSpecDrafter.for_target(llama_target), args=args, target=llama_target, train_dataset=corpus(),
                       data_collator=CorpusCollator(0))
    with pytest.raises(ValueError, match="share of blocks"):
        JetSpecTrainingArguments(output_dir=str(tmp_path), truncated_blocks=1.5)


def test_missing_target_is_an_error(tmp_path, llama_target):
    args = JetSpecTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="needs the frozen target"):
        JetSpecTrainer(model=JetSpecDrafter.for_target(llama_target), args=args)
    with pytest.raises(ValueError, match="labels must be one of"):
        JetSpecTrainingArguments(output_dir=str(tmp_path), labels="magic")


def test_topk_labels_dense_hand_numbers():
    from hf_jetspec.training.losses import TopKLabels

    logits = TopKLabels(torch.tensor([[2, 0]]), torch.tensor([[0.6, 0.3]]).log()).dense(4)
    torch.testing.assert_close(torch.softmax(logits, -1), torch.tensor([[1 / 3, 0.0, 2 / 3, 0.0]]))


def test_topk_divergence_hand_numbers():
    """p = (2/3 on token 2, 1/3 on token 0) from top-2 log-probabilities 0.6, 0.3; q uniform over 4 tokens."""
    from hf_jetspec.training.losses import TopKLabels, divergence

    labels = TopKLabels(torch.tensor([[2, 0]]), torch.tensor([[0.6, 0.3]]).log())
    z = torch.zeros(1, 4)
    expected = 2 / 3 * math.log((2 / 3) / 0.25) + 1 / 3 * math.log((1 / 3) / 0.25)
    assert divergence(labels, z, "forward_kl").item() == pytest.approx(expected, rel=1e-6)
    assert divergence(labels, z, "cross_entropy").item() == pytest.approx(math.log(4), rel=1e-6)
    assert divergence(labels, z, "reverse_kl").item() > 1e3  # q puts mass where p has none


@pytest.mark.parametrize("kind", ["forward_kl", "cross_entropy", "reverse_kl"])
def test_topk_divergence_equals_the_dense_one(kind):
    """Top-k labels (with padding and dropped entries at MISSING_LOGIT, parked on id 0) give the dense
    labels' divergence and gradient."""
    from hf_jetspec.training.losses import MISSING_LOGIT, TopKLabels, divergence, label_argmax, label_known

    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(50, generator=g)[:8] for _ in range(24)]).view(2, 3, 4, 8)
    lp = torch.log_softmax(torch.randn(2, 3, 4, 8, generator=g) * 2, -1)
    drop = torch.rand(2, 3, 4, 8, generator=g) < 0.3
    ids, lp = torch.where(drop, 0, ids), torch.where(drop, MISSING_LOGIT, lp)
    lp[0, 0, 0] = MISSING_LOGIT  # a label with nothing left
    labels = TopKLabels(ids, lp)
    z1 = (torch.randn(2, 3, 4, 50, generator=g) * 3).requires_grad_()
    z2 = z1.detach().clone().requires_grad_()
    sparse, dense = divergence(labels, z1, kind), divergence(labels.dense(50), z2, kind)
    known = label_known(labels)
    assert known.tolist() == label_known(labels.dense(50)).tolist() and not known[0, 0, 0] and known.sum() == 23
    assert torch.equal(label_argmax(labels)[known], label_argmax(labels.dense(50))[known])
    torch.testing.assert_close(sparse[known], dense[known], rtol=1e-5, atol=1e-5)
    (sparse * known).sum().backward()
    (dense * known).sum().backward()
    torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("labels,draft_vocab", [("corpus", None), ("erase", None), ("corpus", 40)])
def test_feature_cache_gives_the_online_loss(tmp_path, llama_target, labels, draft_vocab):
    """With k = the whole vocabulary, a step on cached features has the online step's loss."""
    from hf_jetspec.training import FeatureCacheCollator, FeatureCacheDataset, build_feature_cache

    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target)
    if draft_vocab:
        drafter.restrict_draft_vocab(list(range(0, 128, 3))[:draft_vocab])
    items = corpus(n=6)
    info = build_feature_cache(llama_target, items, drafter.config.target_layer_ids, tmp_path / "cache", top_k=128, batch_size=4,
                               shard_sequences=4, progress=False)
    assert info.num_sequences == 6 and len(info.shards) == 2
    data = FeatureCacheDataset(tmp_path / "cache")
    assert data[5]["input_ids"].tolist() == items[5]["input_ids"]
    args = JetSpecTrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True, block_size=6, blocks_per_sequence=6, labels=labels)
    online = JetSpecTrainer(model=drafter, args=args, target=llama_target, train_dataset=items, data_collator=CorpusCollator(0))
    offline = JetSpecTrainer(model=drafter, args=args, target=llama_target, train_dataset=data, data_collator=FeatureCacheCollator(0))
    with torch.no_grad():
        a = online.compute_loss(drafter, CorpusCollator(0)(items[:4]))
        b = offline.compute_loss(drafter, FeatureCacheCollator(0)([data[i] for i in range(4)]))
    torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


def test_feature_cache_build_resumes(tmp_path, llama_target):
    from hf_jetspec.training import FeatureCacheDataset, build_feature_cache

    items = corpus(n=6)
    whole = build_feature_cache(llama_target, items, [0, 1], tmp_path / "whole", top_k=8, shard_sequences=2, progress=False)
    part = build_feature_cache(llama_target, items[:3], [0, 1], tmp_path / "part", top_k=8, shard_sequences=2, progress=False)
    assert (part.num_sequences, len(part.shards)) == (3, 2)  # 2 + the last 1
    again = build_feature_cache(llama_target, items, [0, 1], tmp_path / "part", top_k=8, shard_sequences=2, progress=False, resume=True)
    assert (again.num_sequences, again.num_tokens) == (whole.num_sequences, whole.num_tokens) == (6, sum(len(x["input_ids"]) for x in items))
    a, b = FeatureCacheDataset(tmp_path / "whole"), FeatureCacheDataset(tmp_path / "part")
    for i in range(6):
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"])
        torch.testing.assert_close(a[i]["states"], b[i]["states"])
    with pytest.raises(ValueError, match="cannot resume"):
        build_feature_cache(llama_target, items, [0], tmp_path / "part", top_k=8, progress=False, resume=True)
    with pytest.raises(ValueError, match="already holds 6"):
        build_feature_cache(llama_target, items[:2], [0, 1], tmp_path / "part", top_k=8, progress=False, resume=True)
    with pytest.raises(ValueError, match="order"):
        build_feature_cache(llama_target, items, [0, 1], tmp_path / "part", top_k=8, progress=False, resume=True, corpus_order="shuffled:0")
    build_feature_cache(llama_target, items[:3], [0, 1], tmp_path / "shuffled", top_k=8, progress=False, corpus_order="shuffled:0")
    with pytest.raises(ValueError, match="depends on the corpus size"):
        build_feature_cache(llama_target, items, [0, 1], tmp_path / "shuffled", top_k=8, progress=False, resume=True, corpus_order="shuffled:0")
    from collections import Counter

    from hf_jetspec.training.feature_cache import frequent_cached_tokens

    counts = Counter(t for x in items for t in x["input_ids"][x["response_start"] :])
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    assert frequent_cached_tokens(a, 3) == ranked[:3] and frequent_cached_tokens(a) == ranked
    only = FeatureCacheDataset(tmp_path / "whole", layer_ids=[1])  # a subset of the stored layers
    hidden = a.info.target_hidden_size
    assert only.info.target_layer_ids == [1] and torch.equal(only[2]["states"], a[2]["states"][:, hidden:])
    with pytest.raises(ValueError, match="not \\[3\\]"):
        FeatureCacheDataset(tmp_path / "whole", layer_ids=[0, 3])
    bf = build_feature_cache(llama_target, items[:2], [0, 1], tmp_path / "bf16", top_k=8, progress=False, states_dtype=torch.bfloat16)
    assert bf.num_sequences == 2 and FeatureCacheDataset(tmp_path / "bf16")[0]["states"].dtype == torch.bfloat16


def test_feature_cache_refuses_mismatches(tmp_path, llama_target):
    from hf_jetspec.training import FeatureCacheDataset, build_feature_cache

    drafter = JetSpecDrafter.for_target(llama_target)
    build_feature_cache(llama_target, corpus(n=2), [0], tmp_path / "cache", top_k=8, progress=False)
    data = FeatureCacheDataset(tmp_path / "cache")
    args = JetSpecTrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    with pytest.raises(ValueError, match="gives target layers"):
        JetSpecTrainer(model=drafter, args=args, target=llama_target, train_dataset=data)
    build_feature_cache(llama_target, corpus(n=2), drafter.config.target_layer_ids, tmp_path / "ok", top_k=8, progress=False)
    alr = JetSpecTrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True, labels="alr")
    with pytest.raises(ValueError, match="rollouts"):
        JetSpecTrainer(model=drafter, args=alr, target=llama_target, train_dataset=FeatureCacheDataset(tmp_path / "ok"))
    (tmp_path / "ok" / "features-00000.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="unreadable"):
        FeatureCacheDataset(tmp_path / "ok")[0]
    with pytest.raises(FileNotFoundError, match="feature_cache.json"):
        FeatureCacheDataset(tmp_path / "nowhere")


def test_lora_trains_only_low_rank_updates_and_merges(tmp_path, llama_target):
    from hf_jetspec.training.lora import lora_drafter, merged_drafter

    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target, init_layers_from_target=True)
    base_q = drafter.layers[0].self_attn.q_proj.weight.detach().clone()
    model = lora_drafter(drafter, rank=4)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any(n.endswith("fc.weight") for n in trainable)
    assert not any(n.endswith("q_proj.base_layer.weight") for n in trainable)
    args = JetSpecTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=8, learning_rate=5e-3,
                                    report_to=[], logging_steps=4, save_steps=1000, block_size=6, blocks_per_sequence=6, use_cpu=True)
    JetSpecTrainer(model=model, args=args, target=llama_target, train_dataset=corpus(), data_collator=CorpusCollator(0)).train()
    assert torch.equal(model.get_base_model().layers[0].self_attn.q_proj.base_layer.weight, base_q)  # frozen base
    ctx = torch.randn(1, 12, len(drafter.config.target_layer_ids) * 64)
    block = torch.randint(0, 128, (1, 2, 5))
    anchors = torch.tensor([[3, 8]])
    with torch.no_grad():
        wrapped = model(context_states=ctx, block_input_ids=block, anchor_positions=anchors).logits
        plain = merged_drafter(model)
        assert type(plain) is JetSpecDrafter
        torch.testing.assert_close(plain(context_states=ctx, block_input_ids=block, anchor_positions=anchors).logits, wrapped, atol=1e-4, rtol=1e-4)
    assert not torch.equal(plain.layers[0].self_attn.q_proj.weight, base_q)  # the update was merged in
    plain.save_pretrained(tmp_path / "merged")
    assert not any("lora" in k for k in JetSpecDrafter.from_pretrained(tmp_path / "merged").state_dict())


def test_training_corpus_skip_gives_disjoint_data(tmp_path, smollm2):
    import json

    from hf_jetspec.training.corpus import load_training_corpus

    _, tokenizer = smollm2
    path = tmp_path / "chats.jsonl"
    with open(path, "w") as f:
        for i in range(10):
            answer = " ".join(f"word{i}-{j}" for j in range(80))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": answer}]}) + "\n")
    key = lambda item: tuple(item["input_ids"])  # noqa: E731
    first = {key(x) for x in load_training_corpus(tokenizer, str(path), num_sequences=4, seq_len=256)}
    later = {key(x) for x in load_training_corpus(tokenizer, str(path), num_sequences=3, seq_len=256, skip=4)}
    both = {key(x) for x in load_training_corpus(tokenizer, str(path), num_sequences=7, seq_len=256)}
    assert len(first) == 4 and len(later) == 3 and not first & later and first | later == both


@pytest.mark.parametrize("labels", ["corpus", "alr"])
def test_bf16_target_with_fp32_master_weights_trains(tmp_path, labels):
    """A bf16 target (the fast configuration) beside an fp32 drafter under bf16 autocast."""
    from helpers import tiny_llama

    target = tiny_llama().to(torch.bfloat16)
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(tiny_llama())
    args = JetSpecTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=20, learning_rate=3e-3, report_to=[],
        logging_steps=5, save_steps=1000, block_size=6, blocks_per_sequence=6, labels=labels, use_cpu=True, bf16=True,
    )
    trainer = JetSpecTrainer(model=drafter, args=args, target=target, train_dataset=corpus(), data_collator=CorpusCollator(0))
    trainer.train()
    assert drafter.dtype == torch.float32  # master weights stay fp32
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("start", ["fresh", "int8-folder"])
def test_restricted_draft_vocab_trains_for_several_steps(tmp_path, start):
    """A drafter whose draft head is a row subset of the target's head trains past its first step,
    whether built fresh (the target unfrozen when it attached) or loaded from an int8-stored folder."""
    from helpers import tiny_llama

    target = tiny_llama()  # its own copy: the trainer freezes what it is given
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(target)
    drafter.restrict_draft_vocab(list(range(0, 128, 2)))
    if start == "int8-folder":
        drafter.save_pretrained(tmp_path / "int8", weight_storage="int8")
        drafter = JetSpecDrafter.from_pretrained(tmp_path / "int8", target=target)
    assert drafter.config.draft_vocab_size == 64
    args = JetSpecTrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, max_steps=4, learning_rate=3e-3, report_to=[],
        logging_steps=1, save_steps=1000, block_size=6, blocks_per_sequence=6, use_cpu=True,
    )
    trainer = JetSpecTrainer(model=drafter, args=args, target=target, train_dataset=corpus(), data_collator=CorpusCollator(0))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert drafter._head().grad_fn is None  # the frozen target's rows carry no graph from step to step


def test_a_cached_label_outside_the_draft_vocabulary_gets_no_weight(llama_target):
    """A top-1 label (online learning's committed token) outside a restricted draft vocabulary would be a
    uniform target after the restriction: its slot is dropped, the others keep their weight."""
    drafter = JetSpecDrafter.for_target(llama_target)
    drafter.restrict_draft_vocab(list(range(10)))
    seq = torch.tensor([[1, 2, 3, 50, 4, 5, 6, 7]])
    topk_ids = torch.cat([seq[:, 1:], seq[:, -1:]], 1)[..., None].to(torch.int32)  # label at t: the token at t + 1
    labels_at = JetSpecTrainer._cached_labels(drafter, topk_ids, torch.zeros(1, 8, 1))
    anchors, valid = torch.tensor([[1]]), torch.tensor([[True]])
    blocks = JetSpecTrainer._corpus_blocks(None, labels_at, None, torch.zeros(1, 8, 4), seq, anchors, valid, 4, torch.ones(4), "corpus")
    # slots predict positions 2..5: tokens 3, 50 (outside the 10-token vocabulary), 4, 5
    assert blocks["weights"][0, 0].tolist() == [1.0, 0.0, 1.0, 1.0]
