"""``DraftingConfig.context_window``: the drafter reads only the newest verified positions. Its pieces
on hand numbers (pending rows, the cache's kept rows), drafts equal to a drafter that only ever saw
those positions, and generation that stays exact (chains, the policy, trees)."""

import pytest
import torch

from hf_jetspec.assistant import assistant_for
from helpers import verified_context

from hf_jetspec import DraftingConfig, JetSpecDrafter
from hf_jetspec.drafter.drafter_cache import DrafterCache, gather_pending, trim_pending


def _pending(*lengths, start=0):
    """Pending entries of one 1-wide layer whose state value is the row's position."""
    out, p = [], start
    for n in lengths:
        pos = torch.arange(p, p + n)
        out.append(([pos.float().view(1, n, 1)], pos))
        p += n
    return out


def test_gather_pending_takes_the_newest_rows_only():
    pending = _pending(5, 1, 2)
    states, positions = gather_pending(pending)
    assert positions.tolist() == list(range(8)) and states[0].view(-1).tolist() == list(range(8))
    states, positions = gather_pending(pending, window=4)
    assert positions.tolist() == [4, 5, 6, 7] and states[0].view(-1).tolist() == [4.0, 5.0, 6.0, 7.0]
    states, positions = gather_pending(pending, window=2)
    assert positions.tolist() == [6, 7] and len(states) == 1
    with pytest.raises(ValueError, match="nothing pending"):
        gather_pending([])


def test_trim_pending_drops_entries_the_window_never_reads():
    pending = _pending(5, 1, 2)
    trim_pending(pending, None)
    assert len(pending) == 3
    trim_pending(pending, 3)  # rows 5, 6, 7 are in the last two entries
    assert [p.tolist() for _, p in pending] == [[5], [6, 7]]
    trim_pending(pending, 4)  # the window reaches past what is left: nothing more to drop
    assert len(pending) == 2


def test_keep_last_moves_the_newest_rows_to_the_front():
    cache = DrafterCache(num_layers=1, capacity=4)
    k = torch.arange(6, dtype=torch.float32).view(1, 1, 6, 1)
    cache.append(0, k, -k)
    cache.keep_last(2)
    keys, values = cache.layer(0)
    assert len(cache) == 2 and keys.view(-1).tolist() == [4.0, 5.0] and values.view(-1).tolist() == [-4.0, -5.0]
    cache.keep_last(5)  # fewer rows than that: unchanged
    assert len(cache) == 2


def test_windowed_cache_drafts_as_a_drafter_that_saw_only_those_positions(trained_llama):
    target, drafter, prompts = trained_llama
    seq, out, whole = verified_context(target, drafter, prompts[:1], n=20)
    states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    window = 6
    windowed = drafter.new_cache()
    drafter.append_context(windowed, states[:, :12], torch.arange(12), window=window)  # a first fill, then more rows
    drafter.append_context(windowed, [states[:, 12:]], torch.arange(12, 20), window=window)
    alone = drafter.new_cache()
    drafter.append_context(alone, states[:, 20 - window :], torch.arange(20 - window, 20))
    block = seq[20:28]
    a, la = drafter.draft_block(windowed, block, 20, return_logits=True)
    b, lb = drafter.draft_block(alone, block, 20, return_logits=True)
    assert len(windowed) == window
    torch.testing.assert_close(la, lb)
    assert torch.equal(a, b)
    c, lc = drafter.draft_block(whole, block, 20, return_logits=True)
    assert not torch.allclose(la, lc)  # the window really changed what the drafter read


@pytest.mark.parametrize("changes", [
    dict(policy=False), dict(policy=True), dict(policy=True, tree="auto"), dict(policy=False, tree="auto"),
])
@pytest.mark.parametrize("window", [1, 5, 64])
def test_generation_with_a_context_window_is_exact(trained_llama, changes, window):
    target, drafter, prompts = trained_llama
    saved = drafter.drafting_config
    drafter.drafting_config = saved.replace(context_window=window, **changes)
    try:
        for i in range(2):
            prompt = prompts[i : i + 1]
            assistant_for(drafter).output_memory.clear()  # earlier tests' outputs would answer these prompts without the drafter
            ref = target.generate(prompt, do_sample=False, max_new_tokens=40)
            out = target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=40)
            assert torch.equal(ref, out)
            assert drafter.generation_stats.drafter_runs > 0
    finally:
        drafter.drafting_config = saved


def test_context_window_refuses_what_it_cannot_serve(llama_target):
    with pytest.raises(ValueError, match="context_window must be None or an int >= 1"):
        DraftingConfig(context_window=0)
    # foresight rounds read the whole context: the window (a shipped default) is not applied there
    assert DraftingConfig(context_window=64, foresight=True).effective_context_window is None
    assert DraftingConfig(context_window=64, num_jacobi_passes=1, num_context_refreshes=1).effective_context_window is None
    assert DraftingConfig(context_window=64).effective_context_window == 64
    drafter = JetSpecDrafter.for_target(llama_target, sliding_window=32)
    drafter.drafting_config = drafter.drafting_config.replace(context_window=16)
    with pytest.raises(ValueError, match="already reads a sliding window"):
        llama_target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, do_sample=False, max_new_tokens=4)
