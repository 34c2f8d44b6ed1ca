"""Online learning: the replay buffer's bounds, weights fixed inside a call, concurrent calls, a
recurring stream where learning must raise acceptance, the guard, save / load / resume, bad input,
exactness (greedy identical, the sampling law with a drafter that changes between calls)."""

import json
import threading

import pytest
import torch
from transformers import TemperatureLogitsWarper

from hf_jetspec import DrafterFreeAssistant, JetSpecAssistant, JetSpecDrafter, OnlineLearningConfig, ReplayBuffer
from hf_jetspec.tools.testing import tiny_llama, tiny_qwen2
from hf_jetspec.training.online import CallRecorder, OnlineLearner, chain_tau, guard_says_revert
from hf_jetspec.training.replay_buffer import item_nbytes, match_top_k, verified_item
from test_sampling_exactness import chi2_pvalue, empirical, exact_joint, small_target


def _drafter(target, seed=0, **options):
    torch.manual_seed(seed)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(**{"policy": False, "tree": None, "budget": 8, **options})
    return drafter


def _item(n=20, start=5, width=8, k=1):
    tokens = torch.arange(n + 1) % 7
    item = verified_item(tokens, torch.randn(n, width), start)
    if k > 1:
        item["topk_ids"] = torch.zeros(n, k, dtype=torch.int32)
        item["topk_logprobs"] = torch.zeros(n, k, dtype=torch.float16)
    return item


# ---------------------------------------------------------------------------------------------- the buffer
def test_verified_item_labels_are_the_next_committed_tokens():
    tokens = torch.tensor([5, 6, 7, 8, 9])
    item = verified_item(tokens, torch.ones(3, 4), response_start=2)
    assert item["input_ids"].tolist() == [5, 6, 7]
    assert item["topk_ids"][:, 0].tolist() == [6, 7, 8]  # position t's label: the token committed at t + 1
    assert item["topk_logprobs"].float().abs().sum() == 0 and item["response_start"] == 2
    with pytest.raises(ValueError, match="state rows"):
        verified_item(tokens, torch.ones(5, 4), 2)  # the last committed token never had a state


def test_buffer_drops_the_oldest_past_its_cap_and_keeps_its_peak():
    one = item_nbytes(_item())
    buffer = ReplayBuffer([1, 2], hidden_size=4, max_bytes=3 * one)
    for i in range(5):
        item = _item()
        item["input_ids"][0] = i  # tag
        buffer.add(item)
    assert len(buffer) == 3 and buffer.nbytes == 3 * one and buffer.dropped == 2
    assert [int(it["input_ids"][0]) for it in buffer.items] == [2, 3, 4]
    assert buffer.peak_bytes == 3 * one and buffer.added == 5
    assert not buffer.add(_item(n=200))  # larger than the cap alone: not kept, nothing dropped for it
    assert len(buffer) == 3 and buffer.peak_bytes <= buffer.max_bytes
    with pytest.raises(ValueError, match="state columns"):
        buffer.add(_item(width=6))


def test_top_k_columns_are_padded_to_the_widest():
    items = match_top_k([_item(), _item(k=4)])
    assert items[0]["topk_ids"].shape == (20, 4) and float(items[0]["topk_logprobs"][0, 1]) < -1e3


def test_buffer_samples_the_newest_first_and_mixes_the_generic_pool():
    buffer = ReplayBuffer([1, 2], hidden_size=4)
    for i in range(4):
        item = _item()
        item["input_ids"][0] = i
        buffer.add(item)
    generic = _item()
    generic["input_ids"][0] = 99
    buffer.generic.append(generic)
    g = torch.Generator().manual_seed(0)
    picked = [int(it["input_ids"][0]) for it in buffer.sample(200, g, newest=1, generic_share=0.5)]
    assert picked[0] == 3
    assert 60 < picked.count(99) < 140


def test_buffer_save_and_load(tmp_path):
    buffer = ReplayBuffer([1, 2], hidden_size=4)
    buffer.add(_item())
    buffer.add(_item(n=30, start=3))
    buffer.save(tmp_path)
    again = ReplayBuffer.load(tmp_path)
    assert len(again) == 2 and again.added == 2 and again.layer_ids == [1, 2]
    for a, b in zip(buffer.items, again.items):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "states", "topk_ids")) and a["response_start"] == b["response_start"]
    with pytest.raises(FileNotFoundError):
        ReplayBuffer.load(tmp_path / "nothing")


def test_recorder_keeps_the_newest_prompt_rows():
    rec = CallRecorder(max_context=4)
    rec.add([torch.randn(1, 10, 2), torch.randn(1, 10, 3)])
    rec.add([torch.randn(1, 2, 2), torch.randn(1, 2, 3)])
    assert rec.states().shape == (6, 5) and rec.dropped_prefix == 6 and rec.count == 12


# ---------------------------------------------------------------------------------------------- learning
def _stream(target, prompts, repeats):
    return [prompts[i % len(prompts)] for i in range(len(prompts) * repeats)]


def test_learning_raises_acceptance_on_a_recurring_stream_and_output_stays_exact():
    target = tiny_llama()
    frozen = _drafter(target)
    learning = _drafter(target)
    assistant = JetSpecAssistant(learning)
    # a random tiny target's distributions are nearly flat: its committed tokens are the sharper signal
    learner = assistant.learn_online(OnlineLearningConfig(steps_per_call=10, lr=3e-3, guard=False, warmup_steps=1, label_top_k=0))
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 128, (1, 6), generator=g) for _ in range(3)]
    taus = {"frozen": [], "learning": []}
    for prompt in _stream(target, prompts, 3):
        plain = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False)
        for name, model in (("frozen", frozen), ("learning", assistant)):
            out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False, assistant_model=model)
            assert torch.equal(out, plain)  # exact with weights that change between calls
            stats = model.generation_stats
            taus[name].append(stats.committed_tokens / stats.rounds)
    last = slice(-3, None)
    frozen_tau, learned_tau = sum(taus["frozen"][last]) / 3, sum(taus["learning"][last]) / 3
    assert learned_tau > 1.3 * frozen_tau, (taus, learner.summary())
    assert learner.steps == 9 * 10 and learner.applied == 9 and learner.kept == 9


def test_weights_never_change_inside_a_call_and_concurrent_calls_stay_exact():
    target = tiny_llama(seed=2)
    drafter = _drafter(target, seed=3)
    assistant = JetSpecAssistant(drafter)
    learner = assistant.learn_online(OnlineLearningConfig(steps_per_call=3, lr=1e-2, guard=False, warmup_steps=1))
    seen = {}  # thread -> list of (call, weight checksum) at every drafted block
    original = drafter.draft_block

    def watched(*args, **kwargs):
        key = threading.get_ident()
        seen.setdefault(key, []).append((calls[key], float(sum(p.double().sum() for p in drafter.parameters()))))
        return original(*args, **kwargs)

    drafter.draft_block = watched
    calls = {}
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 128, (1, 6), generator=g) for _ in range(6)]
    plain = [target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=48, do_sample=False) for p in prompts]
    errors = []

    def worker(offset):
        key = threading.get_ident()
        try:
            for j in range(offset, len(prompts), 2):
                calls[key] = j
                out = target.generate(prompts[j], attention_mask=torch.ones_like(prompts[j]), max_new_tokens=48, do_sample=False,
                                      assistant_model=assistant)
                if not torch.equal(out, plain[j]):
                    errors.append(f"output of prompt {j} differs")
        except Exception as err:  # pragma: no cover - reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for rows in seen.values():
        by_call = {}
        for call, checksum in rows:
            by_call.setdefault(call, set()).add(checksum)
        assert all(len(sums) == 1 for sums in by_call.values()), by_call  # one set of weights per call
    all_sums = {checksum for rows in seen.values() for _, checksum in rows}
    assert len(all_sums) > 1 and learner.applied >= 1  # and the weights did change between calls
    assert learner._active == 0


def test_the_guard_reverts_a_learner_made_worse(trained_llama):
    target, good, prompts = trained_llama
    drafter = JetSpecDrafter(good.config)
    drafter.load_state_dict(good.state_dict())
    drafter.eval()
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, tree=None, budget=8)
    start = {k: v.clone() for k, v in drafter.state_dict().items()}
    assistant = JetSpecAssistant(drafter)
    # a learning rate far too high wrecks the weights within a few steps
    learner = assistant.learn_online(OnlineLearningConfig(steps_per_call=6, lr=0.5, warmup_steps=1, guard_min_calls=2, guard_window=3))
    for prompt in prompts[:8]:
        p = prompt[None]
        target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=40, do_sample=False, assistant_model=assistant)
        if learner.reverts:
            break
    assert learner.reverts >= 1, learner.guard_history
    worse = [h for h in learner.guard_history if "adapted_tau" in h and h["adapted_tau"] < h["base_tau"]]
    assert worse  # it reverted because the adapted weights lost
    assert learner.lr < 0.5
    learner.revert()  # a revert restores the starting weights in the drafter
    assert all(torch.equal(v, start[k]) for k, v in drafter.state_dict().items())


@pytest.mark.parametrize("options", [{"tree": None}, {"tree": "auto"}, {"tree": None, "policy": True}])
def test_soft_labels_are_the_verification_distributions_at_the_right_positions(options):
    """Greedy: at every output position the recorded distribution's top token is the token committed next
    (the labels are read off the logits that decided it), in chain and tree rounds."""
    target = tiny_llama(seed=6)
    assistant = JetSpecAssistant(_drafter(target, seed=6, **options))
    learner = assistant.learn_online(OnlineLearningConfig(steps_per_call=0, guard=False, label_top_k=4))
    p = torch.tensor([[5, 9, 2, 7, 1]])
    target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=30, do_sample=False, assistant_model=assistant)
    item = learner.buffer.items[-1]
    ids, top = item["input_ids"], item["topk_ids"]
    start = item["response_start"]
    assert top.shape[1] == 4 and ids.numel() > start + 10
    for t in range(start - 1, ids.numel() - 1):
        assert int(top[t, 0]) == int(ids[t + 1]), t
        assert float(item["topk_logprobs"][t, 0]) >= float(item["topk_logprobs"][t, 1]) and float(item["topk_logprobs"][t, 0]) < 0
    assert float(item["topk_logprobs"][0, 1]) < -1e3  # a prompt position: the next prompt token alone


def test_the_guard_reverts_only_on_a_significant_loss():
    # mean -0.5, standard error 0.1 / sqrt(3) = 0.058: 8.7 standard errors below zero
    assert guard_says_revert([-0.5, -0.4, -0.6], margin=0.05)
    # mean -0.2, standard error 0.436 / sqrt(3) = 0.252: within noise
    assert not guard_says_revert([0.3, -0.5, -0.4], margin=0.05)
    # significant but within the margin
    assert not guard_says_revert([-0.01, -0.02, -0.015], margin=0.05)
    assert not guard_says_revert([0.0, 0.0, 0.0], margin=0.05)


def test_chain_tau_counts_leading_matches_plus_one():
    target = tiny_llama()
    drafter = _drafter(target)
    seq = target.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=30, do_sample=False)
    with torch.no_grad():
        out = target(seq, output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1][0] for i in drafter.config.target_layer_ids], -1)
    item = verified_item(seq[0], states[:-1], 3)
    tau = chain_tau(drafter, [item], 8, 7, 1, torch.Generator().manual_seed(0))
    assert 1.0 <= tau <= 8.0


# ---------------------------------------------------------------------------------------------- persistence
def test_save_load_and_resume_an_adapted_drafter(tmp_path):
    target = tiny_llama(seed=4)
    drafter = _drafter(target, seed=5)
    assistant = JetSpecAssistant(drafter)
    learner = assistant.learn_online(OnlineLearningConfig(steps_per_call=2, guard=False))
    p = torch.tensor([[1, 2, 3, 4]])
    for _ in range(2):
        target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=30, do_sample=False, assistant_model=assistant)
    learner.save_pretrained(tmp_path / "adapted", save_buffer=True)
    record = json.loads((tmp_path / "adapted" / "online_learning.json").read_text())
    assert record["steps"] == 4 and record["kept_calls"] == 2
    card = (tmp_path / "adapted" / "README.md").read_text()
    assert "| 2 | 2 |" in card  # counts, not text
    again = JetSpecAssistant.from_pretrained(tmp_path / "adapted")
    assert all(torch.equal(a, b) for a, b in zip(again.drafter.state_dict().values(), drafter.state_dict().values()))
    resumed = again.learn_online(OnlineLearningConfig(steps_per_call=1, guard=False), buffer=ReplayBuffer.load(tmp_path / "adapted" / "replay_buffer"))
    assert len(resumed.buffer) == 2
    target.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=30, do_sample=False, assistant_model=again)
    assert len(resumed.buffer) == 3 and resumed.steps == 1


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_input_gets_a_clear_error():
    target = tiny_llama()
    other = tiny_qwen2()
    drafter = _drafter(target)
    with pytest.raises(TypeError, match="has none"):
        OnlineLearner(DrafterFreeAssistant.for_target(target))
    with pytest.raises(ValueError):  # a learner for a drafter of another target
        JetSpecAssistant(_drafter(target)).learn_online(target=other)
    with pytest.raises(ValueError, match="layers"):
        JetSpecAssistant(drafter).learn_online(buffer=ReplayBuffer([0, 1], hidden_size=64))
    with pytest.raises(ValueError, match="time_share"):
        OnlineLearningConfig(time_share=0.0)
    with pytest.raises(ValueError, match="steps_per_call"):
        OnlineLearningConfig(steps_per_call=-1)
    assistant = JetSpecAssistant(drafter)
    assistant.learn_online()
    with pytest.raises(RuntimeError, match="already learns"):
        assistant.learn_online()
    assistant.stop_learning()
    masked = JetSpecDrafter.for_target(target, block_inputs="mask")
    with pytest.raises(ValueError, match="mask"):
        JetSpecAssistant(masked).learn_online()
    frozen = _drafter(target)
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="frozen"):
        JetSpecAssistant(frozen).learn_online()


# ---------------------------------------------------------------------------------------------- the law
def test_sampled_output_follows_the_exact_law_while_the_drafter_learns():
    target = small_target()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(2.0)
    torch.manual_seed(2)
    drafter = JetSpecDrafter.for_target(target).eval()
    drafter.drafting_config = drafter.drafting_config.replace(budget=3, num_jacobi_passes=1, policy=True, sampled_drafts=True)
    assistant = JetSpecAssistant(drafter)
    learner = assistant.learn_online(OnlineLearningConfig(steps_per_call=1, learn_every=20, batch_size=2, blocks_per_sequence=2,
                                                          lr=1e-2, min_new_tokens=1, guard=False, warmup_steps=1))
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, assistant, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) > 1e-3
    assert learner.applied == 30 and learner.kept > 100  # the drafter changed between the calls, 30 times


def test_a_weight_swap_halves_the_drafted_paths_calibration_and_reopens_the_gates():
    from hf_jetspec.policy import OutputMemory

    memory = OutputMemory()
    memory.node_calibration.observe("drafter-chain@1", [0.9, 0.9], [True, False])
    memory.node_calibration.observe("ngram", [0.5], [True])
    gate = memory.draft_gate("chain")
    gate.observe(value=1.0, free_rate=2.0)  # the drafter did not pay: the gate closes behind its probes
    assert not gate.should_draft()
    memory.drafter_changed()
    table = memory.node_calibration.table()
    assert table["drafter-chain@1"] == [(table["drafter-chain@1"][0][0], 0.5, 1.0)]  # 1 of 2 accepted -> 0.5 of 1.0
    assert table["ngram"][0][1:] == (1.0, 1.0)  # other sources keep their counts
    assert gate.should_draft() and gate.advantage is None
    with pytest.raises(ValueError):
        memory.node_calibration.forget("drafter", 1.5)
