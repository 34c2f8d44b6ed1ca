"""Small pure functions on hand-checkable numbers."""

import hashlib

import pytest
import torch

from hf_jetspec import default_target_layer_ids
from hf_jetspec.drafter.configuration_drafter import rope_theta_of
from hf_jetspec.drafter.jacobi import initial_block_inputs, jacobi_refine, refined_block_inputs, sample_noise_tokens
from hf_jetspec.drafter.layers import packed_block_attention
from hf_jetspec.drafter.masks import PackedBlocks, block_attention_mask, context_visibility, truncated_block_mask
from hf_jetspec.generation.stopping import first_stop_length, truncate_generate_output
from hf_jetspec.generation.stats import GenerationStats, accept_length_histogram
from reference_verify import exact_match_verify, greedy_accept_length, point_mass_accept_probability, rejection_accept_probability


def test_default_layer_ids():
    assert default_target_layer_ids(36) == [1, 9, 17, 25, 33]  # DFlash on Qwen3-8B
    assert default_target_layer_ids(30) == [1, 8, 14, 21, 27]  # SmolLM2-135M
    assert default_target_layer_ids(4) == [1]
    assert default_target_layer_ids(1) == [0]
    assert default_target_layer_ids(6, 5) == [1, 2, 3]


def test_rope_theta_of_v5_configs():
    class C:
        rope_parameters = {"rope_theta": 100000.0, "rope_type": "default"}

    class G:
        rope_parameters = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}

    assert rope_theta_of(C()) == 100000.0 and rope_theta_of(G()) == 1e6


def test_jacobi_inputs():
    anchor = torch.tensor([7])
    assert initial_block_inputs(anchor, torch.tensor([1, 2, 3])).tolist() == [7, 1, 2, 3]
    assert refined_block_inputs(anchor, torch.tensor([4, 5, 6, 9])).tolist() == [7, 4, 5, 6]


def test_jacobi_reaches_the_autoregressive_fixed_point():
    # a deterministic causal "drafter": position i predicts (sum of inputs[: i + 1]) mod 10
    def draft_fn(inputs):
        return torch.cumsum(inputs, 0) % 10

    anchor = torch.tensor([3])
    ar = []  # autoregressive greedy decode of the same rule
    seq = [3]
    for _ in range(5):
        ar.append(sum(seq) % 10)
        seq.append(ar[-1])
    j0 = draft_fn(initial_block_inputs(anchor, torch.tensor([0, 0, 0, 0])))
    assert j0[0].item() == ar[0] and j0.tolist() != ar
    one, passes = jacobi_refine(draft_fn, anchor, j0, 1)
    assert passes == 1 and one[:2].tolist() == ar[:2]  # each pass fixes at least one more position
    full, passes = jacobi_refine(draft_fn, anchor, j0, 10)
    assert full.tolist() == ar and passes <= 5  # stops at the fixed point


def test_noise_tokens_come_from_the_context():
    ctx = torch.tensor([11, 12, 13])
    g = torch.Generator().manual_seed(0)
    noise = sample_noise_tokens(ctx, 50, g)
    assert noise.shape == (50,) and set(noise.tolist()) <= {11, 12, 13} and len(set(noise.tolist())) == 3
    assert sample_noise_tokens(ctx, 0, g).numel() == 0


def test_greedy_accept_length():
    assert greedy_accept_length(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3, 4])) == 3
    assert greedy_accept_length(torch.tensor([1, 9, 3]), torch.tensor([1, 2, 3, 4])) == 1
    assert greedy_accept_length(torch.tensor([5, 2, 3]), torch.tensor([1, 2, 3, 4])) == 0


def test_appendix_f3_counterexample():
    # softmax q = 0.9 on the argmax token, target p = 0.6: the rule with that q commits it with 2/3
    assert abs(rejection_accept_probability(0.6, 0.9) - 2 / 3) < 1e-12
    assert point_mass_accept_probability(0.6) == 0.6


def test_exact_match_verify_commits_target_draws():
    # row 0 is a point mass on 4 (draft 4 accepted), row 1 a point mass on 2 (draft 3 rejected -> 2)
    probs = torch.zeros(3, 5)
    probs[0, 4] = probs[1, 2] = probs[2, 0] = 1.0
    out = exact_match_verify(torch.tensor([4, 3]), probs)
    assert (out.accepted, out.bonus, out.committed) == (1, 2, 2)
    probs[1] = 0
    probs[1, 3] = 1.0
    out = exact_match_verify(torch.tensor([4, 3]), probs)
    assert (out.accepted, out.bonus) == (2, 0)


def test_exact_match_verify_frequency():
    # acceptance of a fixed draft token happens with the target's probability of it (0.3)
    probs = torch.tensor([[0.3, 0.7], [0.5, 0.5]])
    g = torch.Generator().manual_seed(0)
    hits = sum(exact_match_verify(torch.tensor([0]), probs, g).accepted for _ in range(4000))
    assert abs(hits / 4000 - 0.3) < 0.03


def test_block_attention_mask():
    m = block_attention_mask(context_visibility(torch.tensor([[2, 3]]), 4), 2, causal=True)[0, 0].int().tolist()
    # rows: block0 pos0, block0 pos1, block1 pos0, block1 pos1; cols: ctx0..3, b0p0, b0p1, b1p0, b1p1
    assert m == [
        [1, 1, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 0, 1, 1],
    ]
    b = block_attention_mask(context_visibility(torch.tensor([[2]]), 2), 2, causal=False)[0, 0].int().tolist()
    assert b == [[1, 1, 1, 1], [1, 1, 1, 1]]


def test_truncated_block_mask_by_hand():
    """Blocks of 3 rows packed; the second block drafts shorter (2 rows exist): its rows 0 and 1 no
    longer see row 2, and row 2 (past its end, no loss) sees the rows that exist and itself."""
    m = truncated_block_mask(3, False, torch.tensor([[3, 2]]))[0].int().tolist()
    assert m[0] == [[1, 1, 1]] * 3
    assert m[1] == [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    causal = truncated_block_mask(3, True, torch.tensor([[1]]))[0, 0].int().tolist()
    assert causal == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]  # the row that exists, and itself
    dense = block_attention_mask(context_visibility(torch.tensor([[1, 1]]), 1), 3, False, torch.tensor([[3, 2]]))[0, 0].int()
    assert dense[3:, 1 + 3:].tolist() == m[1] and dense[3:, 1:4].sum() == 0 and dense[:3, 1:4].tolist() == m[0]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("truncated", [False, True])
def test_packed_block_attention_equals_the_dense_mask(causal, truncated):
    """The structured training attention gives SDPA's output and gradients under the dense mask
    (float32; grouped-query heads; a block whose anchor is 0 sees no context row)."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    bsz, heads, kv_heads, nb, length, ctx, dim = 2, 6, 2, 3, 4, 7, 8
    q = torch.randn(bsz, heads, nb * length, dim, generator=g, requires_grad=True)
    kv = [torch.randn(bsz, kv_heads, n, dim, generator=g, requires_grad=True) for n in (ctx, ctx, nb * length, nb * length)]
    rows = torch.tensor([[4, 1, 2], [3, 4, 4]]) if truncated else None
    blocks = PackedBlocks(context_visibility(torch.tensor([[0, 3, 5], [2, 2, 7]]), ctx), length, causal, rows)
    packed = packed_block_attention(q, *kv, blocks)
    dense = F.scaled_dot_product_attention(q, torch.cat(kv[0::2], 2), torch.cat(kv[1::2], 2), attn_mask=blocks.dense(), enable_gqa=True)
    torch.testing.assert_close(packed, dense, rtol=1e-5, atol=1e-6)
    w = torch.randn(packed.shape, generator=g)
    grads_packed = torch.autograd.grad((packed * w).sum(), [q, *kv])
    grads_dense = torch.autograd.grad((dense * w).sum(), [q, *kv])
    for a, b in zip(grads_packed, grads_dense):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_stats():
    assert accept_length_histogram([0, 2, 2, 5]) == [1, 0, 2, 0, 0, 1]
    s = GenerationStats()
    s.record_round(accepted=3, committed=4, drafted=15)
    s.record_round(accepted=0, committed=1, drafted=15)
    assert s.tau == 2.5 and s.accept_length_hist == [1, 0, 0, 1]
    assert GenerationStats().tau is None
    assert s.merge(s).tau == 2.5 and s.to_dict()["tau"] == 2.5


def test_first_stop_length():
    seq = torch.tensor([[9, 9, 1, 2, 3, 4, 5]])
    ends_with_3 = lambda ids, scores: ids[:, -1] == 3  # noqa: E731
    assert first_stop_length(seq, 2, ends_with_3) == 5
    assert first_stop_length(seq, 2, lambda ids, scores: ids[:, -1] == 7) == 7  # never fires: keep all
    assert first_stop_length(seq, 5, ends_with_3) == 7  # only lengths after the prompt count
    assert truncate_generate_output(seq, 5, 2).tolist() == [[9, 9, 1, 2, 3]]


def test_first_stop_length_ignores_wall_clock_limits():
    import time

    from transformers.generation.stopping_criteria import MaxTimeCriteria, StoppingCriteriaList

    seq = torch.tensor([[9, 9, 1, 2, 3]])
    expired = MaxTimeCriteria(max_time=0.0, initial_timestamp=time.time() - 10)
    assert first_stop_length(seq, 2, StoppingCriteriaList([expired])) == 5  # not cut back to the first token


def test_position_acceptance_by_hand():
    from hf_jetspec.generation.stats import GenerationStats, position_acceptance

    # (drafted, accepted): position 1 is reached by all 4 rounds and accepted in 3; position 2 by the
    # 2 rounds that drafted it and accepted position 1 (both accept it); position 3 by one round, rejected
    rounds = [(3, 0), (3, 2), (2, 2), (1, 1)]
    assert position_acceptance(rounds) == [(4, 3), (2, 2), (1, 0)]
    stats = GenerationStats()
    for (d, a), source in zip(rounds, ["drafter", "ngram", "drafter", "plain"]):
        stats.record_round(accepted=a, committed=a + 1, drafted=d)
        stats.round_sources.append(source)
    assert stats.position_acceptance("drafter") == [(2, 1), (1, 1), (0, 0)]
    assert stats.position_acceptance("ngram") == [(1, 1), (1, 1), (1, 0)]


def test_float8_state_storage_on_hand_numbers():
    """One scale per layer slice (absmax / 448): 896 -> 448 * 2 and 1 -> 0.5 * 2 are exact in e4m3; an
    all-zero slice keeps scale 1; -1 under scale 3.3 / 448 is -135.8, which e4m3 (step 16 between 128
    and 256) rounds to -128, read back as -128 * 3.3 / 448 = -0.9429."""
    from hf_jetspec.training.feature_cache import dequantize_states, quantize_states

    states = torch.tensor([[896.0, 1.0, 0.0, 0.0], [3.3, -1.0, 0.0, 2.0]])
    q, scale = quantize_states(states, num_layers=2)
    assert q.dtype == torch.float8_e4m3fn and torch.allclose(scale, torch.tensor([[2.0, 1.0], [3.3 / 448, 2.0 / 448]]))
    back = dequantize_states(q, scale, torch.float32)
    assert back[0].tolist() == [896.0, 1.0, 0.0, 0.0]
    assert back[1, 0].item() == pytest.approx(3.3, rel=1e-6) and back[1, 1].item() == pytest.approx(-128 * 3.3 / 448, rel=1e-6)
    assert back[1, 3].item() == 2.0


def test_data_scaling_line_on_hand_numbers():
    """tau 1.5 at 1,000 answers and 1.8 at 10,000: slope 0.3 a tenfold (0.0903 a doubling), intercept
    0.6; the line reaches 2.0 at 10^((2.0 - 0.6) / 0.3) = 46,416 answers and gives 2.34 at 800K."""
    from hf_jetspec.training.scaling import answers_for_tau, fit_log_linear, regeneration_cpu_hours, tau_at

    fit = fit_log_linear([1000, 10000], [1.5, 1.8])
    assert fit.slope == pytest.approx(0.3) and fit.intercept == pytest.approx(0.6) and fit.per_doubling == pytest.approx(0.0903, abs=1e-4)
    assert answers_for_tau(fit, 2.0) == pytest.approx(46415.9, rel=1e-5)
    assert tau_at(fit, 800_000) == pytest.approx(0.6 + 0.3 * 5.90309, rel=1e-6)
    three = fit_log_linear([1000, 10000, 100000], [1.5, 1.9, 2.1])  # least squares: slope (2.1 - 1.5) / 2
    assert three.slope == pytest.approx(0.3) and three.intercept == pytest.approx(1.8333333 - 0.3 * 4)
    assert answers_for_tau(fit_log_linear([1000, 2000], [1.6, 1.6]), 2.0) == float("inf")
    with pytest.raises(ValueError, match="two or more"):
        fit_log_linear([3000, 3000], [1.5, 1.6])
    manifest = {"num_sequences": 4000, "cpu_seconds": 7200.0}
    assert regeneration_cpu_hours(manifest, 1000) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="holds 4000"):
        regeneration_cpu_hours(manifest, 5000)
    # a campaign that sped up: 2,000 answers for 6,000 CPU seconds, the next 2,000 for 1,200 more
    sped_up = manifest | {"cpu_seconds_at": {"2000": 6000.0, "4000": 7200.0}}
    assert regeneration_cpu_hours(sped_up, 1000) == pytest.approx(3000 / 3600)  # on the line from (0, 0) to (2000, 6000)
    assert regeneration_cpu_hours(sped_up, 3000) == pytest.approx(6600 / 3600)  # halfway from 6,000 to 7,200
    assert regeneration_cpu_hours(sped_up, 4000) == pytest.approx(2.0)


def test_manifest_record_keeps_the_counts_and_hashes_the_prompt_list():
    """Two prompts hashed "aa" and "bb": the record's hash is SHA-256("aa\nbb"), 80c0d5c7... (by hand
    with sha256sum); the marks and the list itself stay out, the counts stay in."""
    from hf_jetspec.training.scaling import manifest_record

    manifest = {"target": "t", "dtype": "bfloat16", "config": {"seed": 0}, "layer_ids": [1, 2], "sources": {"code": {"prompts": 2}},
                "prompts_sha256": ["aa", "bb"], "num_sequences": 2, "greedy": 1, "sampled": 1, "generated_tokens": 9,
                "cpu_seconds": 4.0, "cpu_seconds_at": {"1": 2.0}}
    got = manifest_record(manifest)
    assert got["prompts"] == 2 and got["prompts_sha256"] == hashlib.sha256(b"aa\nbb").hexdigest()
    assert got["prompts_sha256"].startswith("80c0d5c7")
    assert "cpu_seconds_at" not in got and got["sources"] == {"code": {"prompts": 2}} and got["greedy"] == 1
    assert manifest_record(manifest | {"prompts_sha256": ["bb", "aa"]})["prompts_sha256"] != got["prompts_sha256"]
