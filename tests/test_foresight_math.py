"""Pure functions of foresight drafting on hand-checkable numbers (seed 000, Sections 4.2, App. B, F)."""

import math

import pytest
import torch
from scipy.stats import chisquare

from hf_jetspec.foresight.cache import CachedBlock, SpeculationCache
from hf_jetspec.foresight.calibration import (
    ForesightCalibration,
    anchor_candidates,
    conformal_threshold,
    decoder_position_stats,
    fit_anchor_temperature,
    position_features,
    safe_logit,
)
from hf_jetspec.policy.length_likelihood import fit_feature_weights, length_log_likelihood
from hf_jetspec.foresight.fanout import (
    fit_acceptance_rate,
    fit_fanout_exponent,
    geometric_fanout,
    geometric_length_law,
    largest_remainder,
    surrogate_hit_mass,
)
from hf_jetspec.foresight.outcomes import draft_token_probs, length_probs, outcome_scores, select_top_outcomes
from reference_verify import exact_match_verify

from helpers import tiny_llama


def worked_example():
    """gamma = 2; tokens d1 = 0, d2 = 1, b = 2. p(d1) = 0.8; after d1: p(d2) = 0.5, p(b) = 0.3."""
    rows = torch.tensor([
        [0.8, 0.1, 0.05, 0.05],
        [0.1, 0.5, 0.3, 0.1],
        [0.25, 0.25, 0.25, 0.25],
    ])
    return rows, torch.tensor([0, 1])


def test_proposition1_worked_example():
    rows, draft = worked_example()
    scores = outcome_scores(rows, draft)
    assert scores[1, 2].item() == pytest.approx(0.24)  # 0.8 * 0.5 * (0.3 / 0.5)
    assert scores[1, 1].item() == 0.0  # d2 at k=1 would have been accepted
    assert scores[0, 0].item() == 0.0
    assert scores.sum().item() == pytest.approx(1.0)
    assert draft_token_probs(rows, draft).tolist() == pytest.approx([0.8, 0.5])
    assert length_probs(torch.tensor([0.8, 0.5])).tolist() == pytest.approx([0.2, 0.4, 0.4])
    assert scores.sum(-1).tolist() == pytest.approx([0.2, 0.4, 0.4])
    # verification simulated by the reference exact-match verifier lands on (1, b) 24% of the time
    g = torch.Generator().manual_seed(0)
    n = 20000
    hits = sum(1 for _ in range(n) if (o := exact_match_verify(draft, rows, g)).accepted == 1 and o.bonus == 2)
    assert abs(hits / n - 0.24) < 4 * math.sqrt(0.24 * 0.76 / n)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_proposition1_random_target_perfect_decoder(temperature):
    """With the target itself as the decoder, P(k, a) is the law of the verification outcome."""
    target = tiny_llama(vocab_size=6, seed=3, layers=2).eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 6, (1, 5), generator=g)
    draft = torch.randint(0, 6, (3,), generator=g)
    with torch.no_grad():
        logits = target(torch.cat([prompt, draft[None]], dim=1)).logits[0, prompt.shape[1] - 1:]
    rows = torch.softmax(logits.double() / temperature, -1)  # row j: after the prefix up to d_j
    scores = outcome_scores(rows, draft)
    assert scores.sum().item() == pytest.approx(1.0)
    n = 6000
    counts = torch.zeros_like(scores)
    for _ in range(n):
        o = exact_match_verify(draft, rows, g)
        counts[o.accepted, o.bonus] += 1
    assert counts[scores == 0].sum() == 0  # impossible outcomes never happen
    keep = scores.reshape(-1) * n >= 5
    obs = counts.reshape(-1)[keep].tolist() + [counts.reshape(-1)[~keep].sum().item()]
    exp = (scores.reshape(-1)[keep] * n).tolist() + [(scores.reshape(-1)[~keep] * n).sum().item()]
    assert chisquare(obs, exp).pvalue > 1e-3


def test_select_top_outcomes_orders_and_breaks_ties():
    scores = torch.tensor([[0.0, 0.3, 0.1], [0.3, 0.0, 0.2], [0.05, 0.05, 0.0]])
    assert select_top_outcomes(scores, 3) == [(0, 1), (1, 0), (1, 2)]
    assert select_top_outcomes(scores, 100)[-2:] == [(2, 0), (2, 1)]  # zero-score outcomes never selected
    assert len(select_top_outcomes(scores, 100)) == 6
    with pytest.raises(ValueError):
        select_top_outcomes(scores, 0)


def test_position_features_and_decoder_stats():
    rows, draft = worked_example()
    p_hat, is_top, alt = decoder_position_stats(rows, draft)
    assert p_hat.tolist() == pytest.approx([0.8, 0.5])
    assert is_top.tolist() == [True, True]
    assert alt.tolist() == pytest.approx([0.1 / 0.2, 0.3 / 0.5])
    phi = position_features(torch.tensor([0.5, 0.8]), p_hat, is_top, alt)
    assert phi.shape == (2, 6)
    assert phi[:, 0].tolist() == pytest.approx([0.0, math.log(4)], abs=1e-5)
    assert phi[:, 1].tolist() == pytest.approx([math.log(4), 0.0], abs=1e-5)
    assert phi[:, 2].tolist() == [1.0, 1.0]
    assert phi[:, 4].tolist() == pytest.approx([1 / 14, 2 / 14])
    assert phi[:, 5].tolist() == [1.0, 1.0]


def test_identity_calibration_reproduces_eq6():
    """w = (0, 1, 0, 0, 0, 0) gives p_tilde = p_hat: the calibrated length law is Eq. 6's."""
    rows, draft = worked_example()
    p_hat, is_top, alt = decoder_position_stats(rows, draft)
    phi = position_features(torch.tensor([0.9, 0.9]), p_hat, is_top, alt)
    cal = ForesightCalibration(weights=[0, 1, 0, 0, 0, 0], beta=1.0)
    assert cal.length_probs(phi).tolist() == pytest.approx([0.2, 0.4, 0.4], abs=1e-5)
    scored = {(k, a): s for s, k, a in cal.scored_outcomes(phi, rows, draft)}
    # P(1, b) = 0.4 * 0.3 / 0.5 = 0.24; P(2, a) = 0.4 * 0.25 = 0.1; P(0, 1) = 0.2 * 0.1 / 0.2 = 0.1
    assert scored[(1, 2)] == pytest.approx(0.24, abs=1e-5)
    assert scored[(2, 3)] == pytest.approx(0.1, abs=1e-5)
    assert scored[(0, 1)] == pytest.approx(0.1, abs=1e-5)
    assert (1, 1) not in scored and (0, 0) not in scored
    assert sum(scored.values()) == pytest.approx(1.0, abs=1e-5)
    assert cal.select(phi, rows, draft, cache_size=1) == [(1, 2)]


def test_anchor_candidates_temperature_and_exclusion():
    row = torch.tensor([0.5, 0.3, 0.2, 0.0])
    toks, probs = anchor_candidates(row, excluded=0, beta=1.0)
    assert toks.tolist() == [1, 2]
    assert probs.tolist() == pytest.approx([0.6, 0.4])
    _, sharp = anchor_candidates(row, excluded=0, beta=0.5)  # p^2 renormalised: 0.09 / 0.13
    assert sharp.tolist() == pytest.approx([0.09 / 0.13, 0.04 / 0.13])
    toks, _ = anchor_candidates(row, excluded=None, beta=1.0, top=2)
    assert toks.tolist() == [0, 1]


def test_length_likelihood_hand_numbers():
    p = torch.tensor([[0.8, 0.5]])
    assert length_log_likelihood(p, torch.tensor([1])).item() == pytest.approx(math.log(0.8 * 0.5))
    assert length_log_likelihood(p, torch.tensor([2])).item() == pytest.approx(math.log(0.4))
    assert length_log_likelihood(p, torch.tensor([0])).item() == pytest.approx(math.log(0.2))


def test_fits_recover_planted_parameters():
    g = torch.Generator().manual_seed(0)
    gamma, rounds = 6, 3000
    feats = torch.randn(rounds, gamma, 6, generator=g)
    feats[..., 5] = 1.0
    w_true = torch.tensor([0.8, 1.5, 0.0, -0.5, -1.0, 0.7])
    p = torch.sigmoid(feats @ w_true)
    accept = torch.rand(rounds, gamma, generator=g) < p
    k = torch.cumprod(accept.long(), -1).sum(-1)
    w = torch.tensor(fit_feature_weights(feats, k, l2=0.0))
    assert torch.allclose(w.float(), w_true, atol=0.2)

    beta_true = 0.5
    cands, idx = [], []
    for _ in range(800):
        lp = torch.log_softmax(torch.randn(8, generator=g) * 2, -1)
        law = torch.softmax(lp / beta_true, -1)
        cands.append(lp)
        idx.append(int(torch.multinomial(law, 1, generator=g)))
    assert fit_anchor_temperature(cands, idx) == pytest.approx(beta_true, rel=0.2)


def test_conformal_threshold_hand_numbers():
    scores = [0.1 * i for i in range(1, 10)]  # 0.1 .. 0.9, n = 9
    assert conformal_threshold(scores, 0.2) == pytest.approx(0.2)  # floor(0.2 * 10) = 2nd smallest
    assert conformal_threshold(scores, 0.05) == 0.0  # floor(0.5) = 0: keep everything
    with pytest.raises(ValueError):
        conformal_threshold(scores, 1.5)


def test_calibration_json_round_trip(tmp_path):
    cal = ForesightCalibration(weights=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], beta=0.7, threshold=0.01, coverage=0.9, num_rounds=12)
    cal.save(tmp_path)
    assert ForesightCalibration.load(tmp_path) == cal
    (tmp_path / "foresight_calibration.json").write_text("{not json")
    with pytest.raises(ValueError, match="hf-jetspec calibrate"):
        ForesightCalibration.load(tmp_path)


def test_geometric_fanout_seed_example():
    """alpha = 0.6, rho = 1, gamma = 4, B = 10: all lengths 0.535, lengths {0,1,2,4} 0.567."""
    law = geometric_length_law(0.6, 4)
    assert law.tolist() == pytest.approx([0.4, 0.24, 0.144, 0.0864, 0.1296])
    full = geometric_fanout(0.6, 1.0, 4, 10)
    assert surrogate_hit_mass(law, full, 1.0) == pytest.approx(0.535, abs=5e-4)
    dropped = geometric_fanout(0.6, 1.0, 4, 10, lengths=[0, 1, 2, 4])
    assert surrogate_hit_mass(law, dropped, 1.0) == pytest.approx(0.567, abs=5e-4)
    assert largest_remainder(full, 10) == [3, 2, 2, 1, 2]


def test_fanout_fits():
    assert fit_acceptance_rate([0, 1, 2], gamma=2) == pytest.approx(0.6)
    ranks = [1, 2, 2, 3, 5, None, 1, 8, 2, 4]
    rho = fit_fanout_exponent(ranks, max_anchors=8)
    assert 0.01 < rho < 10


def test_speculation_cache_hits_and_misses():
    cache = SpeculationCache()
    cache.put(CachedBlock(k=2, anchor=7, tokens=torch.tensor([1, 2, 3])))
    assert (2, 7) in cache and len(cache) == 1
    assert cache.lookup(2, 7).tokens.tolist() == [1, 2, 3]
    assert cache.lookup(2, 8) is None
    assert cache.hit_rate == 0.5
    cache.clear()
    assert len(cache) == 0


def test_safe_logit_is_finite():
    assert torch.isfinite(safe_logit(torch.tensor([0.0, 1.0]))).all()


# ---------------------------------------------------------------------- calibration fit and replay
from hf_jetspec.foresight.calibrate import fit_calibration, load_records, save_records  # noqa: E402
from hf_jetspec.foresight.engine import ForesightRecord  # noqa: E402
from hf_jetspec.foresight.replay import FanoutFit, replay_hit_rates, select  # noqa: E402


def record_from_rows(rows, draft, realized, draft_rows=None):
    """A recorded round whose decoder is ``rows`` (a perfect decoder when rows are the target's)."""
    p_hat, is_top, alt = decoder_position_stats(rows, draft)
    dr = rows[:-1] if draft_rows is None else draft_rows
    top1 = dr.max(-1).values
    feats = position_features(top1, p_hat, is_top, alt)
    pv, pi = torch.sort(rows, -1, descending=True)
    dv, di = torch.sort(dr, -1, descending=True)
    return ForesightRecord(
        draft=draft.tolist(), draft_top1=top1.tolist(), draft_own_prob=dr.gather(-1, draft[:, None]).squeeze(-1).tolist(),
        draft_row_tokens=di.tolist(), draft_row_probs=dv.tolist(), p_hat=p_hat.tolist(),
        decoder_row_tokens=pi.tolist(), decoder_row_probs=pv.tolist(), features=feats.tolist(), realized=realized,
    )


def test_replay_rules_on_the_worked_example(tmp_path):
    rows, draft = worked_example()
    rec = record_from_rows(rows, draft, realized=(1, 2))
    identity = ForesightCalibration(weights=[0, 1, 0, 0, 0, 0], beta=1.0)
    # Eq. 6: P(1, b) = 0.24 is the single most likely outcome, so every Eq. 6-based rule hits at B = 1
    assert select(rec, "uncalibrated", 1, identity) == {(1, 2)}
    assert select(rec, "served", 1, identity) == {(1, 2)}
    assert replay_hit_rates([rec], identity, cache_sizes=(1,), rules=("served", "uncalibrated"))["served"][1] == 1.0
    # fan-out with alpha -> 0 puts every anchor at k = 0 and so misses (1, b)
    assert all(k == 0 for k, _ in select(rec, "fanout-decoder", 2, identity, FanoutFit(alpha=0.01, rho=1.0)))
    save_records([rec], tmp_path / "r.jsonl")
    (back,) = load_records(tmp_path / "r.jsonl")
    assert back.draft == rec.draft and back.realized == rec.realized and back.decoder_row_tokens == rec.decoder_row_tokens
    assert torch.allclose(torch.tensor(back.features), torch.tensor(rec.features), rtol=1e-3, atol=1e-4)


def test_fit_calibration_on_perfect_decoder_rounds():
    """Rounds verified by the exact-match rule against the decoder's own rows: the fit stays near Eq. 6."""
    g = torch.Generator().manual_seed(5)
    recs = []
    for _ in range(400):
        rows = torch.softmax(torch.randn(5, 8, generator=g) * 2.5, -1)
        draft = rows[:-1].argmax(-1)
        o = exact_match_verify(draft, rows, g)
        recs.append(record_from_rows(rows, draft, realized=(o.accepted, o.bonus)))
    cal = fit_calibration(recs, miscoverage=0.2)
    assert len(cal.weights) == 6 and cal.num_rounds == 400
    # a perfect decoder needs no correction: the fitted acceptance model stays close to p_hat
    feats = torch.tensor([r.features for r in recs])
    p_hat = torch.tensor([r.p_hat for r in recs])
    assert (cal.accept_probs(feats) - p_hat).abs().mean() < 0.06
    assert 0.5 < cal.beta < 2.0  # anchors were drawn from the decoder's law: no tempering needed
    assert 0 <= cal.threshold <= 1 and cal.coverage == pytest.approx(0.8)
    rates = replay_hit_rates(recs, cal, cache_sizes=(1, 4), fanout=FanoutFit(alpha=0.5, rho=1.0))
    assert rates["served"][4] >= rates["served"][1]
    assert rates["served"][4] >= rates["fanout-draft"][4] - 0.05
