"""Several prompts at once: every row of a left-padded batch equals transformers' batched plain decoding."""

from __future__ import annotations

import pytest
import torch

import hf_jetspec.generation.batched_decoding as bd
from hf_jetspec import DrafterFreeAssistant, DrafterFreeConfig
from hf_jetspec.tools.testing import tiny_llama, tiny_qwen2

ROWS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 3, 3, 9, 3, 3, 9], [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], [7, 1], [11, 12, 13, 11, 12]]


def left_padded(rows, pad=0):
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(rows):
        ids[b, width - len(r):] = torch.tensor(r)
        mask[b, width - len(r):] = 1
    return ids, mask


def same_with_an_early_eos(target, ids, mask, plain, assistant, max_new_tokens):
    """Pick as EOS a token that one row of ``plain`` (the batched plain output) writes early and another
    never writes, decode with it both ways, assert the outputs equal; returns which rows ended."""
    generated = plain[:, ids.shape[1]:].tolist()
    eos = next(t for row in generated for t in row[2:12] if any(t not in other for other in generated))
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0, eos_token_id=eos)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0, eos_token_id=eos,
                          assistant_model=assistant)
    assert torch.equal(out, ref)
    return [bool((row == eos).any()) for row in ref[:, ids.shape[1]:]]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def target(request):
    return tiny_llama() if request.param == "llama" else tiny_qwen2()


@pytest.mark.parametrize("compact", [False, True])
def test_every_row_is_batched_plain_decoding(target, compact, monkeypatch):
    """fp32, greedy: the whole output tensor equals transformers' batched greedy output with the same
    padding, rows proposing and accepting different counts; compacting the cache every round changes nothing."""
    if compact:
        monkeypatch.setattr(bd, "COMPACT_SHARE", 0.0)
    ids, mask = left_padded(ROWS)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0)
    assistant = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(budget=8))
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, assistant_model=assistant, pad_token_id=0)
    assert torch.equal(out, ref)
    stats = assistant.generation_stats
    assert stats.tau > 1.3  # the repetitive rows accepted drafts: the loop did speculate
    assert len(set(stats.accepted_lengths)) > 1  # rows accepted different counts in their rounds


def test_rows_that_stop_early_leave_the_batch_and_are_padded_as_transformers_pads_them(target):
    ids, mask = left_padded(ROWS)
    free = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0)
    generated = free[:, ids.shape[1]:].tolist()
    # an EOS token that one row writes early and another never writes: a batch with both kinds of rows
    eos = next(t for row in generated for t in row[2:12] if any(t not in other for other in generated))
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=eos)
    assistant = DrafterFreeAssistant.for_target(target)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=eos,
                          assistant_model=assistant)
    assert torch.equal(out, ref)
    ended = [bool((row == eos).any()) for row in ref[:, ids.shape[1]:]]
    assert any(ended) and not all(ended)  # rows that stopped early (then padded) beside rows that ran to the limit


def test_bad_batches_get_clear_errors():
    target = tiny_llama()
    assistant = DrafterFreeAssistant.for_target(target)
    ids, mask = left_padded(ROWS[:2])
    right = mask.flip(-1)
    with pytest.raises(ValueError, match="left padding"):
        target.generate(ids.flip(-1), attention_mask=right, assistant_model=assistant, max_new_tokens=4, pad_token_id=0)
    gap = mask.clone()
    gap[0, -3] = 0
    with pytest.raises(ValueError, match="gap inside a row"):
        target.generate(ids, attention_mask=gap, assistant_model=assistant, max_new_tokens=4, pad_token_id=0)
    with pytest.raises(ValueError, match="one mask entry per token"):
        bd.check_left_padded(ids, mask[:, 1:])


def _sliding_targets():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, sliding_window=6)).eval()
    torch.manual_seed(0)
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                                               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                               pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    return {"mistral (every layer sliding)": mistral, "gemma3 (sliding and full layers)": gemma}


@pytest.mark.parametrize("name", ["mistral (every layer sliding)", "gemma3 (sliding and full layers)"])
def test_sliding_window_targets_write_what_batched_plain_decoding_writes(name):
    """fp32, greedy, windows far shorter than the rows: every row equals transformers' batched plain
    decoding with the same padding (whose sliding layers keep a window of columns), rows accepting
    different counts, holes and all; a row that stops early too."""
    target = _sliding_targets()[name]
    ids, mask = left_padded(ROWS)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=None)
    assistant = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(budget=8))
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0, eos_token_id=None,
                          assistant_model=assistant)
    assert torch.equal(out, ref)
    assert assistant.generation_stats.tau > 1.0 and len(set(assistant.generation_stats.accepted_lengths)) > 1  # drafts accepted: holes
    same_with_an_early_eos(target, ids, mask, ref, assistant, 30)


def test_window_mask_on_hand_numbers():
    real = torch.tensor([[1, 1, 0, 1, 1]])  # a hole at column 2
    pos = torch.tensor([[0, 1, 1, 2, 3]])
    query = torch.tensor([[3]])
    assert bd.window_mask(real, pos, query, None).int().tolist() == [[[[1, 1, 0, 1, 1]]]]
    assert bd.window_mask(real, pos, query, 2).int().tolist() == [[[[0, 0, 0, 1, 1]]]]  # 3 - 1 = 2 is not < 2


def test_a_padded_batch_without_a_mask_is_read_as_transformers_reads_it():
    """Rows of different lengths padded with the pad token and no mask: generate infers the mask from the
    pad token, as it does for plain decoding, and the output is the masked batch's."""
    target = tiny_llama()
    ids, mask = left_padded(ROWS[:3], pad=0)
    assistant = DrafterFreeAssistant.for_target(target)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0)
    out = target.generate(ids, do_sample=False, max_new_tokens=12, pad_token_id=0, assistant_model=assistant)
    assert torch.equal(out, ref)


def test_compact_layout_on_hand_numbers():
    index, new = bd.compact_layout(torch.tensor([[0, 1, 0, 1, 1], [1, 1, 1, 0, 1]]))
    assert index.tolist() == [[0, 1, 3, 4], [0, 1, 2, 4]] and new.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]


def test_verify_row_greedy_on_hand_numbers():
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    assert bd._verify_row(logits, [1, 2], do_sample=False) == (2, 0)  # both drafts are the argmax; bonus 0
    assert bd._verify_row(logits, [1, 0], do_sample=False) == (1, 2)  # the second is not: the target's token 2


# ------------------------------------------------------------------------------------------ sampling law at batch 2
def _law_batch(monkeypatch):
    """The enumerable target, a batch of two rows, and the exact law of each row's first tokens."""
    import test_sampling_exactness as se

    target = se.small_target()
    rows = [[1, 3, 0, 2, 1, 3, 0], [2, 2, 1, 2, 2]]
    ids, mask = left_padded(rows, pad=0)
    laws = []
    for r in rows:
        monkeypatch.setattr(se, "PROMPT", torch.tensor([r]))
        laws.append(se.exact_joint(target, []))
    return target, ids, mask, laws


def test_sampling_follows_the_targets_law_row_by_row_at_batch_2(monkeypatch):
    """Each row of a batch of two, sampled with n-gram point-mass proposals, follows the exact law of
    its own first tokens; a verifier that draws the correction from p (not p without the rejected
    draft) is caught by the same test."""
    from test_sampling_exactness import NEW, SAMPLES, chi2_pvalue


    target, ids, mask, laws = _law_batch(monkeypatch)

    def counts(verify=None):
        if verify is not None:
            monkeypatch.setattr(bd, "_verify_row", verify)
        assistant = DrafterFreeAssistant.for_target(target, DrafterFreeConfig(budget=3, output_memory=False))
        torch.manual_seed(99)
        found = [{}, {}]
        drafted = 0
        for _ in range(SAMPLES):
            out = target.generate(ids, attention_mask=mask, assistant_model=assistant, do_sample=True, max_new_tokens=NEW,
                                  min_new_tokens=NEW, pad_token_id=0)
            drafted += sum(assistant.generation_stats.drafted_lengths)
            for b in range(2):
                key = tuple(out[b, ids.shape[1]:].tolist())
                found[b][key] = found[b].get(key, 0) + 1
        assert drafted > SAMPLES  # rounds did verify proposals
        return found

    right = counts()
    assert min(chi2_pvalue(laws[b], right[b]) for b in range(2)) > 1e-3

    def from_p(logits, drafts, do_sample):
        for j, d in enumerate(drafts):
            p = torch.softmax(logits[j].float(), -1)
            if float(torch.rand(())) < float(p[d]):
                continue
            return j, int(torch.multinomial(p, 1))  # wrong: d may be drawn again
        return len(drafts), int(torch.multinomial(torch.softmax(logits[len(drafts)].float(), -1), 1))

    wrong = counts(from_p)
    assert min(chi2_pvalue(laws[b], wrong[b]) for b in range(2)) < 1e-6


# ------------------------------------------------------------------------------------------ the block drafter in batches
@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request):
    """(target, drafter fitted to its greedy continuations, rows cut from the fitting prompts to different lengths)."""
    from helpers import train_drafter_on_greedy

    target = tiny_llama() if request.param == "llama" else tiny_qwen2()
    drafter, prompts = train_drafter_on_greedy(target, seed=0 if request.param == "llama" else 1)
    rows = [p.reshape(-1).tolist()[: 4 + 3 * i] for i, p in enumerate(prompts[:5])]
    return target, drafter, rows


def test_drafter_rows_are_batched_plain_decoding_and_rows_stop_on_their_own(trained):
    """fp32, greedy: with the block drafter every row equals transformers' batched greedy output with the
    same padding, rows accepting different counts, drafted in one forward per pass; then with an EOS that
    some rows write early and others never, the same."""
    from hf_jetspec.assistant import assistant_for

    target, drafter, rows = trained
    ids, mask = left_padded(rows)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0)
    assistant = assistant_for(drafter)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0, assistant_model=assistant)
    assert torch.equal(out, ref)
    stats = assistant.generation_stats
    assert stats.drafter_runs > 0 and "drafter" in stats.round_sources  # drafted blocks were verified
    drafted = [a for a, s in zip(stats.accepted_lengths, stats.round_sources) if s == "drafter"]
    assert max(drafted) >= 2 and len(set(drafted)) > 1  # ... and rows accepted different counts of them

    ended = same_with_an_early_eos(target, ids, mask, ref, assistant, 40)
    assert any(ended) and not all(ended)


def test_drafter_tree_rows_are_batched_plain_decoding(trained):
    """fp32, greedy, ``batch_trees``: a token tree per row (the drafter's top-k with the row's n-gram
    continuation grafted in), rows padded to one width under their own tree masks, each row keeping its
    accepted path's columns: every row equals transformers' batched greedy output, EOS rows too."""
    from hf_jetspec.assistant import assistant_for

    target, drafter, rows = trained
    ids, mask = left_padded(rows)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0)
    assistant = assistant_for(drafter)
    drafter.drafting_config = drafter.drafting_config.replace(batch_trees=True)
    try:
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0, assistant_model=assistant)
        assert torch.equal(out, ref)
        stats = assistant.generation_stats
        assert stats.drafter_runs > 0 and max(stats.accepted_lengths) >= 2
        eos = int(ref[0, ids.shape[1] + 5])
        ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0, eos_token_id=eos)
        out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0, eos_token_id=eos,
                              assistant_model=assistant)
        assert torch.equal(out, ref)
    finally:
        drafter.drafting_config = drafter.drafting_config.replace(batch_trees=False)


def test_tree_rows_on_a_sliding_window_target_keep_the_window():
    """A random drafter's trees on a target whose every layer slides (window 6): the tree masks and the
    window together give what batched plain decoding writes."""
    from hf_jetspec import JetSpecDrafter

    target = _sliding_targets()["mistral (every layer sliding)"]
    torch.manual_seed(1)
    drafter = JetSpecDrafter.for_target(target)
    drafter.drafting_config = drafter.drafting_config.replace(batch_trees=True, budget=6)
    ids, mask = left_padded(ROWS)
    ref = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0, eos_token_id=None)
    out = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0, eos_token_id=None,
                          assistant_model=drafter)
    assert torch.equal(out, ref)
    assert drafter.generation_stats.drafter_runs > 0


def test_tree_round_mask_on_hand_numbers():
    real, pos = torch.tensor([[1, 0, 1]]), torch.tensor([[0, 0, 1]])
    query = torch.tensor([[2, 3, 3]])  # the anchor at 2, two siblings at depth 1
    block = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    got = bd.tree_round_mask(real, pos, query, block, None).int()[0, 0].tolist()
    assert got == [[1, 0, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0], [1, 0, 1, 1, 0, 1]]
    got = bd.tree_round_mask(real, pos, query, block, 2).int()[0, 0].tolist()  # keys 2 or more positions back drop out
    assert got == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 0, 1]]


def test_draft_rows_drafts_each_row_as_its_own_cache_would(trained):
    """One forward over three rows with contexts of different lengths (and a window that slides) gives
    each row the draft and top-1 probability that drafting it alone against its own cache gives."""
    target, drafter, _ = trained
    drafter.attach_target(target)
    torch.manual_seed(3)
    width = sum(drafter.config.target_hidden_size for _ in drafter.config.target_layer_ids)
    lengths, window, gamma = [5, 12, 9], 10, 4
    contexts = drafter.new_row_contexts(3, window)
    alone = [drafter.new_cache() for _ in lengths]
    states = [torch.randn(1, n, width) for n in lengths]
    for step in (slice(0, 3), slice(3, None)):  # two appends: the second slides the longer rows' windows
        chunk = [s[:, step] for s in states]
        places = [torch.arange(n)[step] for n in lengths]
        drafter.append_row_contexts(contexts, [[c] for c in chunk], places)
        for cache, c, p in zip(alone, chunk, places):
            drafter.append_context(cache, c, p, window=window)
    assert contexts.lengths == [5, 10, 9]
    blocks = torch.randint(0, drafter.config.target_vocab_size, (3, gamma))
    starts = torch.tensor(lengths)
    ids, top1 = drafter.draft_rows(contexts, blocks, starts)
    for b in range(3):
        one, summary = drafter.draft_block_summary(alone[b], blocks[b], int(starts[b]))
        assert torch.equal(ids[b], one)
        assert torch.allclose(top1[b], summary.top1_prob, atol=1e-5)


def test_row_contexts_on_hand_numbers():
    from hf_jetspec.drafter.row_contexts import RowContexts

    def kv(values):  # one layer, one head, head_dim 1: the keys are the values written
        t = torch.tensor(values, dtype=torch.float32).reshape(1, 1, -1, 1)
        return [(t, t.clone())]

    ctx = RowContexts(1, 3, window=3)
    ctx.write(kv([1, 2, 10]), [2, 0, 1])
    ctx.write(kv([3, 4, 20, 21]), [2, 2, 0])  # row 0 passes the window: it keeps 2, 3, 4
    layers, visible = ctx.view()
    assert ctx.lengths == [3, 2, 1]
    assert layers[0][0][:, 0, :, 0].tolist()[0] == [2, 3, 4]
    assert layers[0][0][1, 0, :2, 0].tolist() == [20, 21] and layers[0][0][2, 0, :1, 0].tolist() == [10]
    assert visible.tolist() == [[True, True, True], [True, True, False], [True, False, False]]
    ctx.select([2, 0])
    assert ctx.lengths == [1, 3] and ctx.view()[0][0][0][1, 0, :, 0].tolist() == [2, 3, 4]
    with pytest.raises(ValueError, match="window"):
        ctx.write(kv([1, 2, 3, 4]), [4, 0])


def test_batched_drafter_refuses_what_it_does_not_run_by_name(trained):
    from hf_jetspec.assistant import assistant_for

    target, drafter, rows = trained
    ids, mask = left_padded(rows[:2])
    assistant = assistant_for(drafter)
    options = drafter.drafting_config
    try:
        options.compiled_rounds, options.tree = True, "auto"
        with pytest.raises(ValueError, match="compiled rounds run one sequence"):
            target.generate(ids, attention_mask=mask, assistant_model=assistant, max_new_tokens=4, pad_token_id=0)
    finally:
        options.compiled_rounds = False
    assistant.learn_online(target=target)
    try:
        with pytest.raises(ValueError, match="online learning records one sequence"):
            target.generate(ids, attention_mask=mask, assistant_model=assistant, max_new_tokens=4, pad_token_id=0)
    finally:
        assistant.stop_learning()


def test_drafted_batches_follow_the_targets_law_row_by_row(monkeypatch):
    """Sampling at batch 2 with the block drafter's drafts verified as point masses: each row follows the
    exact law of its own first tokens."""
    from test_sampling_exactness import NEW, SAMPLES, chi2_pvalue, sharp_drafter

    from hf_jetspec.assistant import assistant_for

    target, ids, mask, laws = _law_batch(monkeypatch)
    drafter = sharp_drafter(target)
    drafter.drafting_config.ngram = False  # every proposal from the drafter
    assistant = assistant_for(drafter)
    torch.manual_seed(99)
    found, drafted = [{}, {}], 0
    for _ in range(SAMPLES):
        out = target.generate(ids, attention_mask=mask, assistant_model=assistant, do_sample=True, max_new_tokens=NEW,
                              min_new_tokens=NEW, pad_token_id=0)
        drafted += sum(d for d, s in zip(assistant.generation_stats.drafted_lengths, assistant.generation_stats.round_sources)
                       if s == "drafter")
        for b in range(2):
            key = tuple(out[b, ids.shape[1]:].tolist())
            found[b][key] = found[b].get(key, 0) + 1
    assert drafted > SAMPLES  # drafted blocks were verified
    assert min(chi2_pvalue(laws[b], found[b]) for b in range(2)) > 1e-3
