"""SpecCTMC: the seed's worked example, exactness against enumerated laws, and the MLM adapter."""

import math

import pytest
import torch
from scipy.stats import chisquare

from hf_jetspec.ctmc import (
    accepted_mass,
    acceptance_probability,
    exact_final_law,
    mark_law,
    next_tick,
    rejection_probability,
    residual_law,
    sample,
    speculative_sample,
)

RED, BLUE, MASK = 0, 1, 2
# the worked example, marks ordered (A red, A blue, B red, B blue)
D_EX = torch.tensor([[3.0, 1.0], [1.0, 3.0]], dtype=torch.float64) / 8
P_EX = torch.tensor([[1.0, 3.0], [2.0, 2.0]], dtype=torch.float64) / 8


def close(a, b):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=1e-12)


def test_worked_example_marks():
    assert close(accepted_mass(P_EX, D_EX), torch.tensor([[1.0, 1.0], [1.0, 2.0]]) / 8)
    assert close(rejection_probability(P_EX, D_EX), 3 / 8)
    assert close(residual_law(P_EX, D_EX), torch.tensor([[0.0, 2.0], [1.0, 0.0]]) / 3)
    # accepted mass + rejection probability x correction law recovers P
    assert close(accepted_mass(P_EX, D_EX) + rejection_probability(P_EX, D_EX) * residual_law(P_EX, D_EX), P_EX)
    assert close(acceptance_probability(P_EX, D_EX, 0, RED), 1 / 3)


def test_worked_example_clock_and_paths():
    # E1 = 2 log 2 with two masks, E2 = log 2 with one: ticks 1/2 and 1/4
    t1 = next_tick(1.0, 2, 2 * math.log(2))
    assert abs(t1 - 0.5) < 1e-12 and abs(next_tick(t1, 1, math.log(2)) - 0.25) < 1e-12
    # propose A red (3/8), reject it (2/3), correct to A blue (2/3): 1/6
    p = float(D_EX[0, RED]) * (1 - acceptance_probability(P_EX, D_EX, 0, RED)) * float(residual_law(P_EX, D_EX)[0, BLUE])
    assert abs(p - 1 / 6) < 1e-12
    # second tick, after A blue: draft B blue 3/4, target 1/4 -> committed blue mass (3/4)(1/3) = 1/4
    d2 = torch.tensor([[0.0, 0.0], [0.25, 0.75]], dtype=torch.float64)
    p2 = torch.tensor([[0.0, 0.0], [0.75, 0.25]], dtype=torch.float64)
    blue = float(d2[1, BLUE]) * acceptance_probability(p2, d2, 1, BLUE) + float(rejection_probability(p2, d2) * residual_law(p2, d2)[1, BLUE])
    assert abs(blue - 0.25) < 1e-12 and close(residual_law(p2, d2)[1], [1.0, 0.0])
    # the target probability of the ordered marks A blue then B blue: (3/8)(1/4) = 3/32
    assert abs(float(P_EX[0, BLUE]) * blue - 3 / 32) < 1e-12


def test_mark_law():
    probs = torch.tensor([[[0.2, 0.8], [0.5, 0.5], [0.1, 0.9]]])
    law = mark_law(probs, torch.tensor([[True, False, True]]))
    assert close(law, torch.tensor([[[0.1, 0.4], [0.0, 0.0], [0.05, 0.45]]]))


class TableDenoiser:
    """A time-independent denoiser given by explicit per-state tables (the worked example)."""

    def __init__(self, table, default):
        self.table, self.default = table, default

    def __call__(self, tokens, t):
        rows = []
        for seq in tokens.tolist():
            probs = torch.zeros(2, 3)
            for pos in range(2):
                probs[pos, :2] = torch.tensor(self.table.get((tuple(seq), pos), self.default))
            rows.append(probs)
        return torch.stack(rows)


def example_pair():
    target = TableDenoiser(
        {((MASK, MASK), 0): (0.25, 0.75), ((MASK, MASK), 1): (0.5, 0.5),
         ((RED, MASK), 1): (0.25, 0.75), ((BLUE, MASK), 1): (0.75, 0.25)},
        default=(0.5, 0.5),
    )
    draft = TableDenoiser(
        {((MASK, MASK), 0): (0.75, 0.25), ((MASK, MASK), 1): (0.25, 0.75),
         ((RED, MASK), 1): (0.25, 0.75), ((BLUE, MASK), 1): (0.25, 0.75)},
        default=(0.5, 0.5),
    )
    return target, draft


class RandomDenoiser:
    """Tiny time-independent denoiser whose token law at a position depends on the other positions."""

    def __init__(self, length, vocab, seed, sharpness=2.0):
        g = torch.Generator().manual_seed(seed)
        self.length, self.vocab, self.mask = length, vocab, vocab
        self.bias = torch.randn(length, vocab, generator=g) * sharpness
        self.pair = torch.randn(length, length, vocab + 1, vocab, generator=g) * sharpness

    def __call__(self, tokens, t):
        b, length = tokens.shape
        logits = self.bias.expand(b, -1, -1).clone()
        for q in range(length):
            logits += self.pair[:, q][:, tokens[:, q]].permute(1, 0, 2) * (tokens[:, q] != self.mask)[:, None, None]
        probs = torch.zeros(b, length, self.vocab + 1)
        probs[..., : self.vocab] = torch.softmax(logits, -1)
        return probs


def chi2_p(law, samples):
    n = samples.shape[0]
    counts = {}
    for row in samples.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert set(counts) <= set(law), "a sample outside the support of the exact law"
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for key, p in law.items():
        if p * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(p * n)
        else:
            rest_o += counts.get(key, 0)
            rest_e += p * n
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    exp = [e * sum(obs) / sum(exp) for e in exp]
    return chisquare(obs, exp).pvalue


def position_kept_residual(target_law, draft_law, position, token):
    """The correction keeps the rejected mark's position (residual over tokens only)."""
    row = torch.clamp(target_law[position] - draft_law[position], min=0)
    if float(row.sum()) == 0:
        row = target_law[position].clone()
    law = torch.zeros_like(target_law)
    law[position] = row / row.sum()
    return law


def target_law_as_correction(target_law, draft_law, position, token):
    """Deliberately wrong: after a rejection, draw from P itself instead of the residual."""
    return target_law


CUTOFF = 1e-12  # never reached in practice: the completion rule does not enter the enumerated law


def test_worked_example_exactness_and_cost():
    target, draft = example_pair()
    law = exact_final_law(target, 2, MASK)
    assert abs(law[(BLUE, BLUE)] - (3 / 8 * 1 / 4 + 2 / 8 * 0.5)) < 1e-12  # A-first and B-first paths
    g = torch.Generator().manual_seed(0)
    out, stats = speculative_sample(target, draft, 2, 4000, mask_id=MASK, draft_length=2, cutoff=CUTOFF, generator=g)
    assert chi2_p(law, out) > 1e-3
    # expected sequential calls 1 + 3/8 = 11/8 and evaluated rows 2 + 3/8 = 19/8 per sample
    assert abs(stats.target_calls / 4000 - 11 / 8) < 0.03
    assert abs(stats.evaluated_rows / 4000 - 19 / 8) < 0.03
    ref = sample(target, 2, 4000, mask_id=MASK, cutoff=CUTOFF, generator=torch.Generator().manual_seed(1))
    assert chi2_p(law, ref) > 1e-3


@pytest.mark.parametrize("draft_length", [1, 3])
def test_random_denoisers_match_exact_law(draft_length):
    target, draft = RandomDenoiser(3, 3, seed=0), RandomDenoiser(3, 3, seed=1)
    law = exact_final_law(target, 3, 3)
    assert abs(sum(law.values()) - 1) < 1e-6 and len(law) == 27  # fp32 denoiser
    g = torch.Generator().manual_seed(draft_length)
    spec, stats = speculative_sample(target, draft, 3, 3000, mask_id=3, draft_length=draft_length, cutoff=CUTOFF, generator=g)
    assert chi2_p(law, spec) > 1e-3
    assert stats.corrections > 0 and stats.accepted > 0 and stats.events == 3 * 3000
    assert sum(stats.accepted_prefix_hist) == stats.rounds and stats.target_calls == stats.rounds
    ref = sample(target, 3, 3000, mask_id=3, cutoff=CUTOFF, generator=torch.Generator().manual_seed(7))
    assert chi2_p(law, ref) > 1e-3


def test_wrong_correction_is_detected():
    target, draft = RandomDenoiser(3, 3, seed=0), RandomDenoiser(3, 3, seed=1)
    law = exact_final_law(target, 3, 3)
    out, _ = speculative_sample(target, draft, 3, 3000, mask_id=3, draft_length=3, cutoff=CUTOFF, generator=torch.Generator().manual_seed(3), residual_rule=target_law_as_correction)
    assert chi2_p(law, out) < 1e-3


def test_position_kept_residual_is_also_exact_here():
    """Every mark law of this chain puts mass 1/m on each masked position (draft and target alike),
    so a residual over the rejected position's tokens has the same total mass as the joint residual
    and the position-kept correction is exact too. The joint residual is the general rule; this
    test records that the tokens-only variant is not a detectable error for this family."""
    target, draft = RandomDenoiser(3, 3, seed=0), RandomDenoiser(3, 3, seed=1)
    law = exact_final_law(target, 3, 3)
    out, _ = speculative_sample(target, draft, 3, 3000, mask_id=3, draft_length=3, cutoff=CUTOFF, generator=torch.Generator().manual_seed(3), residual_rule=position_kept_residual)
    assert chi2_p(law, out) > 1e-3
    # one-event identity: per position, min(p, q) + (1 - sum min(p, q)) * residual == p
    p, q = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64), torch.tensor([0.5, 0.2, 0.3], dtype=torch.float64)
    resid = torch.clamp(p - q, min=0) / torch.clamp(p - q, min=0).sum()
    assert close(torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * resid, p)


def test_completion_rule_at_the_cutoff():
    # a cutoff just below 1: the first tick falls below it, so every position is drawn at once
    target, draft = RandomDenoiser(3, 3, seed=0), RandomDenoiser(3, 3, seed=1)
    probs = target(torch.full((1, 3), 3), torch.ones(1))[0, :, :3]
    law = {(a, b, c): float(probs[0, a] * probs[1, b] * probs[2, c]) for a in range(3) for b in range(3) for c in range(3)}
    cutoff = 1 - 1e-9
    ref, rstats = sample(target, 3, 2000, mask_id=3, cutoff=cutoff, generator=torch.Generator().manual_seed(0), return_stats=True)
    spec, sstats = speculative_sample(target, draft, 3, 2000, mask_id=3, cutoff=cutoff, generator=torch.Generator().manual_seed(1))
    assert rstats.completions == 2000 and sstats.completions == 2000
    assert chi2_p(law, ref) > 1e-3 and chi2_p(law, spec) > 1e-3


def test_bad_arguments():
    target, draft = example_pair()
    with pytest.raises(ValueError, match="draft_length"):
        speculative_sample(target, draft, 2, mask_id=MASK, draft_length=0)
    with pytest.raises(ValueError, match="cutoff"):
        sample(target, 2, mask_id=MASK, cutoff=0.0)


@pytest.fixture(scope="module")
def antiberty():
    from hf_jetspec.ctmc import antiberty_denoiser, load_antiberty

    model, tok = load_antiberty()
    return model, tok, antiberty_denoiser(model, tok)


def test_mlm_adapter_protocol_and_batched_rows(antiberty):
    model, tok, den = antiberty
    g = torch.Generator().manual_seed(0)
    aa = torch.tensor([i for i in range(25) if i not in tok.all_special_ids])
    states = aa[torch.randint(0, 20, (6, 40), generator=g)]
    states[torch.rand(6, 40, generator=g) < torch.linspace(0.1, 0.9, 6)[:, None]] = tok.mask_token_id
    batched = den(states, torch.full((6,), 0.5))
    assert batched.shape == (6, 40, 25)
    assert torch.allclose(batched.sum(-1), torch.ones(6, 40), atol=1e-5)
    assert float(batched[..., tok.mask_token_id].abs().max()) == 0.0
    assert float(batched[..., tok.all_special_ids].abs().max()) == 0.0
    for i in range(6):  # the exactness condition: batched verification rows equal single rows
        single = den(states[i : i + 1], torch.full((1,), 0.5))
        assert torch.allclose(batched[i : i + 1], single, atol=1e-5, rtol=1e-4)


def test_antiberty_speculative_with_truncated_draft(antiberty):
    from hf_jetspec.ctmc import antiberty_denoiser, truncated_masked_lm

    model, tok, den = antiberty
    draft = antiberty_denoiser(truncated_masked_lm(model, 2), tok)
    out, stats = speculative_sample(den, draft, 24, 2, mask_id=tok.mask_token_id, draft_length=4, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 24) and not bool((out == tok.mask_token_id).any())
    assert set(out.flatten().tolist()) <= set(range(5, 25))
    assert stats.target_calls < 2 * 24 and stats.accepted > 0  # fewer sequential target calls than events


def test_stats_merge():
    from hf_jetspec.ctmc import CTMCStats

    a = CTMCStats(samples=1, events=3, rounds=2, target_calls=2, accepted_prefix_hist=[1, 1])
    b = CTMCStats(samples=1, events=2, rounds=1, target_calls=1, accepted_prefix_hist=[0, 0, 1])
    m = a.merge(b)
    assert (m.samples, m.events, m.rounds, m.target_calls, m.accepted_prefix_hist) == (2, 5, 3, 3, [1, 1, 1])
    assert m.events_per_call == 5 / 3
