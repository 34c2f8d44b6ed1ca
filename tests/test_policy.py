"""The round policy's pure parts: verify-length selection, cost model, n-gram sources, draft gate, acceptance model."""

import math

import pytest
import torch

from hf_jetspec.policy import (
    AcceptanceModel,
    AcceptanceRecord,
    Candidate,
    CostModel,
    DraftGate,
    NgramIndex,
    NgramProposal,
    OutputMemory,
    ScoreCalibration,
    acceptance_features,
    best_candidate,
    choose_tree_size,
    choose_verify_length,
    chain_conditionals,
    expected_committed,
    expected_committed_tree,
    fit_acceptance,
    interpolate_monotone,
    node_features,
    periodic_continuation,
    position_bucket,
    propose_ngram,
    score_bin,
)
from hf_jetspec.assistant import assistant_for

pytestmark = pytest.mark.measured_costs  # the cost model's own arithmetic, fed synthetic timings


# ---------------------------------------------------------------------- verify-length selection
def test_expected_committed_by_hand():
    # E(0) = 1, E(1) = 1 + 0.5, E(2) = 1.5 + 0.5*0.5, E(3) = 1.75 + 0.25*0.2
    assert expected_committed([0.5, 0.5, 0.2]) == pytest.approx([1.0, 1.5, 1.75, 1.8])


def test_tree_size_by_hand():
    # E(n) = 1 + the path probabilities of the first n nodes: 1, 1.5, 1.9, 2.0
    assert expected_committed_tree([0.5, 0.4, 0.1]) == pytest.approx([1.0, 1.5, 1.9, 2.0])
    # rates 1/1, 1.5/1.1 = 1.36, 1.9/1.2 = 1.58, 2.0/1.3 = 1.54: two nodes
    choice = choose_tree_size([0.5, 0.4, 0.1], [1.0, 1.1, 1.2, 1.3])
    assert (choice.length, choice.expected_tokens) == (2, pytest.approx(1.9))
    # a drafter pass of 0.5 s on top: 1.5/1.6, 1.9/1.7 = 1.12, 2.0/1.8 = 1.11: still two nodes
    assert choose_tree_size([0.5, 0.4, 0.1], [1.0, 1.1, 1.2, 1.3], draft_cost=0.5).length == 2
    assert choose_tree_size([0.05, 0.05], [1.0, 1.2, 1.2]).length == 0  # not worth a larger forward


def test_node_features_mark_only_the_top1_candidate_agreed():
    f = node_features(torch.tensor([[0.5, 0.25], [0.8, 0.1]]), torch.tensor([True, True]))
    assert f.shape == (2, 2, 4)
    assert f[:, :, 1].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert f[0, 1].tolist() == pytest.approx([math.log(0.25 / 0.75), 0.0, 0.0, 1.0])
    assert f[1, 0, 2].item() == pytest.approx(math.log(2))  # depth 2
    assert AcceptanceModel().accept_probs(f).flatten().tolist() == pytest.approx([0.5, 0.25, 0.8, 0.1])  # uncalibrated: raw


def test_score_calibration_by_hand():
    assert [score_bin(s) for s in (0.01, 0.02, 0.03, 0.45, 0.5, 0.55, 0.95)] == [0, 0, 1, 6, 6, 7, 11]
    cal = ScoreCalibration(prior_weight=4.0)
    assert cal("drafter", [0.5, 0.1]) == [0.5, 0.1]  # nothing observed: the raw scores
    cal.observe("drafter", [0.45, 0.5, 0.55, 0.42], [False, False, True, False])
    # bin (0.4, 0.5]: 0 of 3 accepted -> (0 + 4 * 0.5) / (3 + 4); bin (0.5, 0.6]: 1 of 1 -> (1 + 4 * 0.6) / (1 + 4)
    assert cal("drafter", [0.5, 0.6]) == pytest.approx([2 / 7, 3.4 / 5])
    assert cal("ngram", [0.5]) == [0.5]  # sources are kept apart
    assert cal.table() == {"drafter": [(6, 0.0, 3.0), (7, 1.0, 1.0)]}
    with pytest.raises(ValueError):
        ScoreCalibration(prior_weight=0)


def test_plain_step_wins_when_drafts_are_unlikely():
    # every verify length costs 1.2x a plain step; 1 + 0.1 < 1.2, so L = 0
    choice = choose_verify_length([0.1, 0.1], [1.0, 1.2, 1.2])
    assert (choice.length, choice.expected_tokens, choice.cost_s) == (0, 1.0, 1.0)


def test_full_length_wins_when_verification_is_flat():
    choice = choose_verify_length([0.9] * 4, [1.0, 1.0, 1.0, 1.0, 1.0])
    assert choice.length == 4
    assert choice.expected_tokens == pytest.approx(1 + 0.9 + 0.81 + 0.729 + 0.6561)


def test_intermediate_length_by_hand():
    # costs 1, 1.1, 1.5, 2.0; p = (0.9, 0.9, 0.1)
    # rates: L0 1/1 = 1; L1 1.9/1.1 = 1.727; L2 2.71/1.5 = 1.807; L3 2.791/2.0 = 1.396
    choice = choose_verify_length([0.9, 0.9, 0.1], [1.0, 1.1, 1.5, 2.0])
    assert choice.length == 2
    assert choice.rate == pytest.approx(2.71 / 1.5)


def test_draft_cost_is_paid_only_when_drafting():
    # with a draft cost of 1.0, 1.9 / 2.1 < 1: a plain step wins; without it, L = 1 wins
    assert choose_verify_length([0.9], [1.0, 1.1], draft_cost=1.0).length == 0
    assert choose_verify_length([0.9], [1.0, 1.1]).length == 1


def test_verify_length_limited_by_costs_and_probs():
    assert choose_verify_length([0.99] * 10, [1.0, 1.0, 1.0]).length == 2
    assert choose_verify_length([0.99], [1.0] * 10).length == 1
    with pytest.raises(ValueError):
        choose_verify_length([0.5], [])


def test_best_candidate_picks_source_and_truncates():
    costs = [1.0, 1.0, 1.0, 1.5]
    ngram = Candidate("ngram", [5, 6, 7], [0.3, 0.3, 0.3])
    drafter = Candidate("drafter", [8, 9, 10], [0.9, 0.9, 0.01])
    pick = best_candidate([ngram, drafter], costs)
    assert pick.source == "drafter" and pick.tokens == [8, 9] and pick.choice.length == 2
    assert best_candidate([Candidate("ngram", [1], [0.0])], costs).source == "plain"
    assert best_candidate([], costs).tokens == []


# ---------------------------------------------------------------------- cost model
def test_interpolation_is_monotone_and_extrapolates():
    sizes, secs = [1, 4, 8], [1.0, 0.8, 2.0]  # a noisy dip at 4 is lifted to 1.0
    assert interpolate_monotone(sizes, secs, 4) == 1.0
    assert interpolate_monotone(sizes, secs, 6) == pytest.approx(1.5)
    assert interpolate_monotone(sizes, secs, 12) == pytest.approx(3.0)
    assert interpolate_monotone(sizes, secs, 1) == 1.0


def test_cost_model_tracks_synthetic_timings():
    # profile says 10 ms + 1 ms/token; the rounds really take 3 ms more (the loop's overhead)
    sizes = [1, 2, 4, 8, 16]
    model = CostModel(sizes, [0.010 + 0.001 * (n - 1) for n in sizes], ema=0.2)
    for i in range(200):
        n = 1 + i % 16
        model.observe_verify(n, 0.013 + 0.001 * (n - 1))
        model.observe_draft(2, 0.004)
    assert model.overhead_s == pytest.approx(0.003, abs=1e-6)
    assert model.verify_cost(5) == pytest.approx(0.017)
    assert model.verify_costs(2) == pytest.approx([0.013, 0.014, 0.015])
    assert model.draft_cost(3) == pytest.approx(0.006)
    summary = model.summary(3)
    assert len(summary["verify_ms"]) == 4 and summary["draft_pass_ms"] == pytest.approx(2.0)


def test_cost_model_rejects_empty_profile():
    with pytest.raises(ValueError):
        CostModel([], [])


# ---------------------------------------------------------------------- n-gram sources
def test_ngram_index_longest_most_recent_match():
    idx = NgramIndex(max_ngram=3)
    idx.extend([1, 2, 3, 9, 2, 3, 7, 8])
    idx.extend([2, 3])
    # suffix (2, 3): latest earlier occurrence is at 4..5, followed by 7, 8, 2, 3
    assert idx.lookup(4) == ([7, 8, 2, 3], 2)
    idx.extend([7])
    # suffix (2, 3, 7) occurred at 4..6, followed by 8
    assert idx.lookup(2) == ([8, 2], 3)


def test_a_match_near_the_end_runs_on_as_a_copy_of_itself():
    """(5, 6) last occurred at 1..2, three tokens back: what followed it, 5 and 6, is the start of a
    loop of period 2, so the proposal goes on 5, 6, 5, 6 rather than stopping at the sequence's end."""
    idx = NgramIndex(max_ngram=4)
    idx.extend([7, 5, 6, 5, 6])
    assert idx.lookup(6) == ([5, 6, 5, 6, 5, 6], 2)
    assert periodic_continuation([1, 2, 3, 9, 1, 2], 4, 5) == [1, 2, 1, 2, 1]  # period 2
    assert periodic_continuation([4, 8, 4, 8, 3], 2, 5) == [4, 8, 3, 4, 8]  # period 3: the lap includes the 3
    assert periodic_continuation([1, 2, 3], 1, 2) == [2, 3]  # enough tokens: no copy


def test_distinct_continuations_longest_match_then_latest_first():
    """Sequence 1 2 7 | 1 2 8 | 3 2 9 | 1 2: the suffix (1, 2) occurred twice (followed by 8 then 7,
    the latest first), the suffix (2,) three times (9 after 3 2 is new; the two after 1 2 are
    already in). ``keep=2`` holds the latest two occurrences of each n-gram."""
    idx = NgramIndex(max_ngram=2, keep=2)
    idx.extend([1, 2, 7, 1, 2, 8, 3, 2, 9, 1, 2])
    assert idx.continuations(2, limit=8) == [([8, 3], 2), ([7, 1], 2), ([9, 1], 1)]
    assert idx.continuations(2, limit=1) == [idx.lookup(2)]  # the first is the chain rounds' proposal
    # keep=1 forgets the earlier occurrences: the latest of (1, 2), then the latest of (2,), already in
    one = NgramIndex(max_ngram=2, keep=1)
    one.extend([1, 2, 7, 1, 2, 8, 3, 2, 9, 1, 2])
    assert one.continuations(2, limit=8) == [([8, 3], 2), ([9, 1], 1)]


def test_branch_conditionals_hand_numbers():
    """A second candidate (rank 1) that shares one token with the first, whose rates are 0.8, 0.6, 0.5:
    position 1 is the shared node (0.8), position 2 its own first token, (1 - 0.6) / 2 = 0.2, position 3
    the first candidate's rate again (0.5); past the first candidate's end, its last rate."""
    from hf_jetspec.generation.ngram_tree import branch_conditionals, divergence_depth

    assert branch_conditionals([0.8, 0.6, 0.5], 1, 1, 4) == pytest.approx([0.8, 0.2, 0.5, 0.5])
    assert branch_conditionals([0.9], 0, 3, 2) == pytest.approx([0.025, 0.9])  # rank 3: (1 - 0.9) / 4
    assert divergence_depth([4, 5, 6], [[4, 5, 9], [4, 1]]) == 2
    assert divergence_depth([7], [[4, 5]]) == 0


def test_ngram_index_no_match_and_incremental_equals_batch():
    idx = NgramIndex(max_ngram=2)
    idx.extend([1, 2, 3])
    assert idx.lookup(5) == ([], 0)
    a, b = NgramIndex(max_ngram=3), NgramIndex(max_ngram=3)
    seq = [4, 5, 4, 5, 6, 4, 5, 6, 4]
    a.extend(seq)
    for t in seq:
        b.extend([t])
    assert a.lookup(3) == b.lookup(3) == ([5, 6, 4], 3)  # (5, 6, 4) at 3..5, then 5, 6, 4
    with pytest.raises(ValueError):
        NgramIndex(max_ngram=0)


def test_output_memory_proposes_from_earlier_sequences():
    mem = OutputMemory(memory_ngram=3)
    mem.add_sequence([10, 11, 12, 13, 14, 15])
    idx = NgramIndex(max_ngram=2)
    idx.extend([1, 11, 12])  # no match inside the sequence, and only 2 tokens match memory's 3-gram key
    assert propose_ngram(idx, mem, 4) is None
    idx.extend([13])
    idx2 = NgramIndex(max_ngram=2)
    idx2.extend([99, 11, 12, 13])
    prop = propose_ngram(idx2, mem, 2)
    assert prop == NgramProposal([14, 15], "memory", 3)
    mem.clear()
    assert propose_ngram(idx2, mem, 2) is None


def test_forgetting_the_oldest_sequence_leaves_the_index_a_rebuild_would_give():
    """Past ``max_sequences`` the oldest is forgotten: every lookup then answers as a memory built from
    the kept sequences alone (3 tokens over 4 symbols: n-grams recur across sequences)."""
    import itertools
    import random

    rng = random.Random(0)
    mem = OutputMemory(memory_ngram=2, max_sequences=3)
    for step in range(40):
        mem.add_sequence([rng.randrange(4) for _ in range(rng.randrange(2, 9))])
        assert len(mem.sequences) == min(step + 1, 3)
        rebuilt = OutputMemory(memory_ngram=2, max_sequences=3)
        for seq in mem.sequences:
            rebuilt.add_sequence(seq)
        for key in itertools.product(range(4), repeat=2):
            assert mem.lookup(key, 5) == rebuilt.lookup(key, 5), (step, key)
    assert len(mem._next) <= sum(max(len(s) - 2, 0) for s in mem.sequences)  # forgotten n-grams do not pile up


def test_output_memory_acceptance_counts():
    mem = OutputMemory(prior=(1.0, 1.0))
    prop = NgramProposal([1, 2, 3], "sequence", 2)
    assert mem.accept_probs(prop) == [0.5, 0.5, 0.5]
    mem.observe(prop, verified=3, accepted=1)  # position 1 accepted, 2 rejected, 3 unseen
    # p1 = (1 + 1) / (1 + 2); p2 = (0 + 2 p1) / (1 + 2) = 4/9; p3, unseen, keeps p2
    assert mem.accept_probs(prop) == pytest.approx([2 / 3, 4 / 9, 4 / 9])
    mem.observe(prop, verified=3, accepted=3)
    # p1 = 3/4; p2 = (1 + 2 * 3/4) / (2 + 2) = 0.625; p3 = (1 + 2 * 0.625) / (1 + 2) = 0.75
    assert mem.accept_probs(prop) == pytest.approx([3 / 4, 0.625, 0.75])
    other = NgramProposal([1], "memory", 3)  # another source keeps its own counts
    assert mem.accept_probs(other) == [0.5]


# ---------------------------------------------------------------------- draft gate
def test_draft_gate_closes_and_probes_with_backoff():
    gate = DraftGate(ema=1.0, min_probe=2, max_probe=8)
    assert gate.should_draft()  # nothing known yet
    gate.observe(0.5, free_rate=1.0)  # drafting did not pay
    closed = []
    for _ in range(40):
        if gate.should_draft():
            closed.append(gate.since_draft + 1)
            gate.observe(0.5, 1.0)
        else:
            gate.skipped()
    assert closed[:5] == [2, 4, 8, 8, 8]  # probe intervals double up to the cap
    gate.observe(2.0, free_rate=1.0)  # a probe that paid opens the gate
    assert gate.should_draft() and gate.probe == 2


# ---------------------------------------------------------------------- acceptance model
def test_draft_gate_probes_no_more_than_a_share_of_the_time():
    gate = DraftGate()
    gate.limit_probe_cost(draft_s=0.05, step_s=0.1)  # 0.05 / (0.02 * 0.1) = 25 rounds: the floor of 32 holds
    assert gate.max_probe == 32
    gate.limit_probe_cost(draft_s=1.0, step_s=0.33)  # a dear drafter pass: 1 / (0.02 * 0.33) = 151.5 -> 152
    assert gate.max_probe == 152
    gate.limit_probe_cost(draft_s=1.0, step_s=0.33, share=0.1)
    assert gate.max_probe == 32  # 30.3 -> 31, below the floor


def test_chain_estimates_are_calibrated_conditionals_with_a_carried_correction():
    # position 1: (0 + 4 * 0.8) / (4 + 4) = 0.4, correction 0.5; position 2 unobserved: 4 * 0.6 * 0.5 / 4 = 0.3
    assert chain_conditionals([0.8, 0.6], [(0, 4), (0, 0)], 4.0) == pytest.approx([0.4, 0.3])
    # an underconfident drafter: (4 + 4 * 0.5) / 8 = 0.75, correction 1.5; 0.9 * 1.5 is clipped to 1
    assert chain_conditionals([0.5, 0.9], [(4, 4), (0, 0)], 4.0) == pytest.approx([0.75, 1.0])
    calibration = ScoreCalibration(prior_weight=4.0)
    for _ in range(6):  # six blocks, position 1 rejected every time: position 2 was never reached
        calibration.observe_chain("drafter-chain", [0.9, 0.5], accepted=0)
    # (0 + 4 * 0.9) / (6 + 4) = 0.36, correction 0.4; then 4 * 0.5 * 0.4 / 4 = 0.2
    assert calibration.chain("drafter-chain", [0.9, 0.5]) == pytest.approx([0.36, 0.2])
    calibration.observe_chain("drafter-chain", [0.9, 0.9, 0.9], accepted=1)  # position 2 rejected, position 3 not reached
    # (1 + 3.6) / 11 = 0.41818, correction 0.46465; (0 + 4 * 0.9 * 0.46465) / (1 + 4) = 0.33455
    assert calibration.chain("drafter-chain", [0.9, 0.9]) == pytest.approx([4.6 / 11, 3.6 * (4.6 / 11 / 0.9) / 5])
    assert [position_bucket(j) for j in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 40)] == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 7]


def test_a_drafter_whose_drafts_are_never_accepted_soon_stops_being_verified(llama_target, monkeypatch):
    """A confident drafter that is always wrong (its draft vocabulary is one token the target never
    writes here), verification dearer than a plain step and a drafter pass half a step: after a few
    rounds its blocks are no longer verified, and it runs only in rare probes, in this call and the next."""
    import hf_jetspec.policy as policy_module
    from hf_jetspec import JetSpecDrafter

    monkeypatch.setattr(policy_module, "cost_profile_for", lambda target, n: ([1, 2, 16, 32], [0.010, 0.016, 0.020, 0.026]))
    monkeypatch.setattr(CostModel, "draft_cost", lambda self, passes: 0.005 * passes)
    monkeypatch.setattr(CostModel, "observe_verify", lambda self, n, seconds: None)  # the prices above, whatever the machine's load
    prompt = torch.tensor([[5, 17, 33, 2, 90, 41, 7, 12]])
    plain = llama_target.generate(prompt, do_sample=False, max_new_tokens=120)
    never = next(t for t in range(llama_target.config.vocab_size) if t not in plain[0].tolist())
    torch.manual_seed(0)
    drafter = JetSpecDrafter.for_target(llama_target).eval()
    drafter.restrict_draft_vocab([never])  # top-1 probability 1: the raw estimates are as high as they go
    drafter.drafting_config = drafter.drafting_config.replace(ngram=False, ngram_seed=False, num_jacobi_passes=0)
    for call in range(2):
        out = llama_target.generate(prompt, do_sample=False, max_new_tokens=120, assistant_model=drafter)
        assert torch.equal(out, plain)
        stats = drafter.generation_stats
        verified = [i for i, source in enumerate(stats.round_sources) if source == "drafter"]
        assert stats.tau == 1.0 and len(stats.round_sources) == 119  # the first token comes with the prompt's forward
        # call 0: a few blocks teach the calibration, later probes verify at most a short block; call 1 starts from what call 0 learnt
        assert len(verified) <= (8 if call == 0 else 4), verified
        # call 0: a few rounds to learn, then probes after 2, 4, 8, ... skipped rounds (at most 7 in 119);
        # call 1: the gate is still closed, its probes at the cap of 32 rounds (a pass is cheap here): at most 4 in 119
        assert stats.drafter_runs <= (15 if call == 0 else 4), stats.drafter_runs


def test_acceptance_features_by_hand():
    feats = acceptance_features(torch.tensor([0.5, 0.9]), torch.tensor([True, False]))
    assert feats.shape == (2, 4)
    assert feats[0].tolist() == pytest.approx([0.0, 1.0, 0.0, 1.0])
    assert feats[1].tolist() == pytest.approx([math.log(9), 0.0, math.log(2), 1.0])
    raw = AcceptanceModel()
    assert not raw.calibrated
    assert raw.accept_probs(feats).tolist() == pytest.approx([0.5, 0.9])


def test_fit_acceptance_learns_the_agreement_signal(tmp_path):
    # synthetic rounds: a position is accepted iff it "agreed", whatever the drafter's probability
    g = torch.Generator().manual_seed(0)
    records = []
    for _ in range(300):
        agreed = torch.rand(6, generator=g) < 0.7
        probs = torch.rand(6, generator=g) * 0.8 + 0.1
        k = int(torch.cumprod(agreed.int(), 0).sum())
        records.append(AcceptanceRecord(acceptance_features(probs, agreed).tolist(), accepted=k, verified=6))
    model = fit_acceptance(records[:200], records[200:])
    assert model.calibrated and model.num_rounds == 200
    assert model.held_out_log_likelihood > model.raw_log_likelihood
    p = model.accept_probs(acceptance_features(torch.tensor([0.5, 0.5]), torch.tensor([True, False])))
    assert p[0] > 0.9 and p[1] < 0.1
    path = model.save(tmp_path)
    again = AcceptanceModel.load(tmp_path)
    assert again.weights == pytest.approx(model.weights)
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        AcceptanceModel.load(tmp_path)
    with pytest.raises(ValueError):
        fit_acceptance([])


def test_cost_model_learns_each_length_it_sees():
    # a noisy profile says 16 tokens cost no more than 1; the rounds say 16 tokens cost 1.5x
    model = CostModel([1, 16], [0.040, 0.040], ema=0.5, min_observations=3)
    for _ in range(4):
        model.observe_verify(1, 0.040)
        model.observe_verify(16, 0.060)
    costs = model.verify_costs(15)
    assert costs[0] == pytest.approx(0.040) and costs[15] == pytest.approx(0.060)
    # lengths never observed lie on the line between the observed ones: 8 tokens, 7/15 of the way
    assert costs[7] == pytest.approx(0.040 + 0.020 * 7 / 15)
    assert model.verify_cost(16) == pytest.approx(0.060)


def test_cost_model_scales_the_profile_to_what_rounds_measure():
    # a warm-up profile over a short context; at a long one a plain step takes 93 ms, not 46
    model = CostModel([1, 12], [0.046, 0.064], min_observations=1)
    assert model.verify_cost(12) == pytest.approx(0.064)  # nothing observed: the profile (+ no overhead yet)
    model.observe_verify(1, 0.093)
    assert model.verify_cost(12) == pytest.approx(0.093 * 0.064 / 0.046)  # the profile's shape, scaled to the plain step
    model.observe_verify(12, 0.204)
    assert model.verify_cost(12) == pytest.approx(0.204)
    assert model.verify_cost(23) == pytest.approx(0.204 * model.forward_cost(23) / 0.064)  # past the largest observed size


def test_a_cheaper_two_token_forward_is_kept_and_chosen():
    # bf16 attention on CPU over an 8k cache: one query row 135 ms, two rows 99 ms (benchmarks/round_profile.py)
    model = CostModel([1, 2, 16], [0.024, 0.027, 0.035], min_observations=1)
    model.observe_verify(1, 0.135)
    model.observe_verify(2, 0.099)
    costs = model.verify_costs(3)
    assert costs[0] == pytest.approx(0.135) and costs[1] == pytest.approx(0.099)  # not lifted to 0.135
    assert choose_verify_length([0.1, 0.1, 0.1], costs).length >= 1  # even a 10% guess beats the plain step


def test_a_sampled_fit_is_stored_beside_the_greedy_one_and_used_only_when_sampling(tmp_path, llama_target):
    from hf_jetspec import JetSpecDrafter
    from hf_jetspec.assistant import JetSpecAssistant
    from hf_jetspec.policy.acceptance import SAMPLED_ACCEPTANCE_CALIBRATION_NAME

    greedy = AcceptanceModel(weights=[1.0, 0.0, 0.0, 0.0], num_rounds=10)
    sampled = AcceptanceModel(weights=[0.5, 1.0, 0.0, -1.0], num_rounds=12, temperature=0.7, top_p=0.9)
    drafter = JetSpecDrafter.for_target(llama_target)
    drafter.save_pretrained(tmp_path / "weights-only")  # the model alone writes no calibration
    assert not (tmp_path / "weights-only" / "acceptance_calibration.json").exists()
    assert not assistant_for(JetSpecDrafter.from_pretrained(tmp_path / "weights-only")).acceptance_model.calibrated
    JetSpecAssistant(drafter, acceptance_model=greedy, sampled_acceptance_model=sampled).save_pretrained(tmp_path)
    assert (tmp_path / SAMPLED_ACCEPTANCE_CALIBRATION_NAME).exists() and (tmp_path / "acceptance_calibration.json").exists()
    again = JetSpecDrafter.from_pretrained(tmp_path)
    assert assistant_for(again).sampled_acceptance_model.temperature == 0.7 and assistant_for(again).sampled_acceptance_model.top_p == 0.9
    assert assistant_for(again).acceptance_model_for(True).weights == sampled.weights
    assert assistant_for(again).acceptance_model_for(False).weights == greedy.weights
    (tmp_path / SAMPLED_ACCEPTANCE_CALIBRATION_NAME).unlink()
    plain = JetSpecDrafter.from_pretrained(tmp_path)
    assert assistant_for(plain).sampled_acceptance_model is None and assistant_for(plain).acceptance_model_for(True).weights == greedy.weights


def test_a_batch_width_is_chosen_for_all_rows_from_the_batch_price():
    from hf_jetspec.policy import choose_batch_width, expected_committed

    # two rows: E = [1, 1.9, 2.7] and [1, 1.2]; a wider forward of the batch costs 1.0 / 1.1 / 1.3
    assert choose_batch_width([[1, 1.9, 2.7], [1, 1.2]], [1.0, 1.1, 1.3]).length == 2  # 3.9 / 1.3 = 3.0 beats 3.1 / 1.1
    assert choose_batch_width([[1, 1.9, 2.7], [1, 1.2]], [1.0, 1.1, 2.0]).length == 1  # the wide forward is dear here
    assert choose_batch_width([[1.0], [1.0]], [1.0]).length == 0  # nothing proposed: a plain step for every row
    assert choose_batch_width([expected_committed([0.1]), expected_committed([0.1])], [1.0, 1.5]).length == 0  # not worth it


@pytest.mark.measured_costs
def test_the_batch_cost_profile_is_measured_once_per_row_count():
    from hf_jetspec.policy import batch_cost_profile_for, cost_profile_for
    from hf_jetspec.tools.testing import tiny_llama

    target = tiny_llama()
    sizes, seconds = batch_cost_profile_for(target, 8, rows=3)
    assert sizes == [1, 2, 4, 8] and len(seconds) == 4 and all(s > 0 for s in seconds)
    assert batch_cost_profile_for(target, 8, rows=3) is batch_cost_profile_for(target, 8, rows=3)  # kept, not measured again
    assert batch_cost_profile_for(target, 8, rows=1) == cost_profile_for(target, 8)  # one row is the one-row profile
