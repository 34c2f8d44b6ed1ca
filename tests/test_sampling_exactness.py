"""Sampled output with a drafter must follow the target's exact distribution (Appendix F.3)."""

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import hf_jetspec.generation.candidate_generator as cg
from hf_jetspec import JetSpecDrafter
from hf_jetspec.assistant import assistant_for

VOCAB = 4
PROMPT = torch.tensor([[1, 3, 0, 2]])
NEW = 4  # first token from the prefill, then a round drafts two tokens and verification adds a bonus
SAMPLES = 600  # every fault below is detected at p < 1e-12 with 600 draws (benchmarks/law_test_power.py)


def small_target():
    torch.manual_seed(11)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # spread the logits so the law is far from uniform
        model.lm_head.weight.mul_(8.0)
    return model


def sharp_drafter(target):
    torch.manual_seed(2)
    drafter = JetSpecDrafter.for_target(target).eval()
    with torch.no_grad():
        drafter.norm.weight.mul_(2.0)  # q(d) ~ 0.5-0.8: confident, far from p(d), not one-hot
    drafter.drafting_config.budget = 3
    drafter.drafting_config.num_jacobi_passes = 1
    return drafter


def exact_joint(target, processors):
    """P(x1..xNEW) by enumeration, applying the same logits processors as generate."""
    law = {}
    with torch.no_grad():
        for seq in itertools.product(range(VOCAB), repeat=NEW):
            ids = PROMPT.clone()
            prob = 1.0
            for tok in seq:
                logits = target(ids).logits[:, -1].float()
                for proc in processors:
                    logits = proc(ids, logits)
                prob *= float(torch.softmax(logits, -1)[0, tok])
                ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
            law[seq] = prob
    return law


def empirical(target, drafter, sources=None, **gen_kwargs):
    """Counts of the first NEW tokens over SAMPLES calls; ``sources`` (a dict), if given, counts the
    policy's round sources over all calls."""
    torch.manual_seed(1234)
    counts = {}
    for _ in range(SAMPLES):
        out = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), assistant_model=drafter,
                              do_sample=True, max_new_tokens=NEW, min_new_tokens=NEW, **gen_kwargs)
        key = tuple(out[0, PROMPT.shape[1]:].tolist())
        counts[key] = counts.get(key, 0) + 1
        if sources is not None:
            for source, n in drafter.generation_stats.source_counts.items():
                sources[source] = sources.get(source, 0) + n
            sources["grafted"] = sources.get("grafted", 0) + drafter.generation_stats.grafted_nodes
    return counts


def chi2_pvalue(law, counts):
    keys = sorted(law, key=law.get, reverse=True)
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for k in keys:
        e = law[k] * SAMPLES
        if e >= 5:
            obs.append(counts.get(k, 0))
            exp.append(e)
        else:
            rest_o += counts.get(k, 0)
            rest_e += e
    obs.append(rest_o)
    exp.append(rest_e)
    total = sum(exp)
    exp = [x * sum(obs) / total for x in exp]
    return chisquare(obs, exp).pvalue


class SoftmaxAsProposal(cg.JetSpecCandidateGenerator):
    """Deliberately wrong: hands transformers the drafter's softmax as q for argmax tokens."""

    def get_candidates(self, input_ids, **kwargs):
        candidates, _ = super().get_candidates(input_ids, **kwargs)
        gamma = candidates.shape[1] - input_ids.shape[1]
        if gamma == 0:
            return candidates, None
        block = torch.cat([input_ids[0, -1:], candidates[0, input_ids.shape[1]:-1]])
        _, logits = self.drafter.draft_block(self.cache, block, input_ids.shape[1] - 1, return_logits=True)
        return candidates, logits[None].float()


def wrong_speculative_sampling(ratio: str = "p/q", residual: bool = True):
    """Algorithm 1 of Leviathan et al. with a deliberate fault, to patch over transformers' verifier:
    ``ratio="q/p"`` accepts with min(1, q/p); ``residual=False`` draws the correction from p, not
    from norm(max(p - q, 0))."""

    def verify(candidate_input_ids, candidate_logits, candidate_length, new_logits, assistant_ensemble_weight=None):
        drafts = candidate_input_ids[0, -candidate_length:]
        q, p = candidate_logits[0].softmax(-1), new_logits[0].softmax(-1)
        rows = torch.arange(candidate_length)
        q_i, p_i = q[rows, drafts], p[rows, drafts]
        r = (q_i / p_i) if ratio == "q/p" else (p_i / q_i)
        ok = torch.rand_like(r) <= r
        n = int(((~ok).cumsum(-1) < 1).sum())
        if n < candidate_length and residual:
            fix = torch.clamp(p[n] - q[n], min=0)
            fix = fix / fix.sum()
        else:
            fix = p[n]
        t = torch.multinomial(fix, 1)
        return torch.cat([drafts[:n], t])[None], torch.tensor(n)

    return verify


def verify_without_residual(drafts, q_logits, p_logits, uniforms=None, point_masses=False, process_row=None):
    """Deliberately wrong chain verifier: after a rejection it draws from p, not from p without the rejected draft."""
    from hf_jetspec.generation.sampled_drafting import draw_rows

    for i in range(p_logits.shape[0] if process_row else 0):
        process_row(i)
    p = torch.softmax(p_logits.float(), -1)
    n = 0
    while n < drafts.numel() and float(torch.rand(())) < float(p[n, drafts[n]]):
        n += 1
    return torch.cat([drafts[:n].long(), draw_rows(p[n][None])]), n


@pytest.fixture(scope="module")
def target():
    return small_target()


@pytest.mark.parametrize("kwargs", [{"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 0, "top_p": 0.8}])
@pytest.mark.parametrize("policy", [False, True])
def test_sampled_chain_drafts_follow_the_exact_law(target, kwargs, policy, monkeypatch):
    """Drafts drawn from q and verified with min(1, p/q) (transformers' verifier, handed our proposal logits)."""
    import hf_jetspec.policy as policy_module
    from hf_jetspec.policy import AcceptanceModel, CostModel

    # verification nearly flat in length and a drafter pass a twentieth of a step: the policy mixes its sources
    monkeypatch.setattr(policy_module, "cost_profile_for", lambda target, n: ([1, 2, 3], [0.010, 0.0105, 0.011]))
    monkeypatch.setattr(CostModel, "draft_cost", lambda self, passes: 0.0005 * passes)

    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=policy, sampled_drafts=True)
    # sampled drafts priced high where the last pass agreed with its inputs, low elsewhere: the policy mixes sources
    assistant_for(drafter).sampled_acceptance_model = AcceptanceModel(weights=[0.0, 3.0, 0.0, -2.0], temperature=1.0)
    processors = [TemperatureLogitsWarper(kwargs["temperature"])]
    if "top_p" in kwargs:
        processors.append(TopPLogitsWarper(kwargs["top_p"]))
    law = exact_joint(target, processors)
    sources = {}
    counts = empirical(target, drafter, sources=sources, **kwargs)
    if policy:  # the policy mixed sources: blocks drawn from q and n-gram point masses
        assert sources.get("drafter", 0) > 100 and sources.get("ngram", 0) > 100, sources
    else:
        assert drafter.generation_stats.sampled_drafts >= 1  # the last call drew its block from q
    assert chi2_pvalue(law, counts) > 1e-3


@pytest.mark.parametrize("fault", [{"ratio": "q/p"}, {"residual": False}])
def test_a_wrong_rejection_verifier_is_detected(target, monkeypatch, fault):
    import transformers.generation.utils as gen_utils

    monkeypatch.setattr(gen_utils, "_speculative_sampling", wrong_speculative_sampling(**fault))
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=True)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) < 1e-3


def test_the_correct_reference_verifier_passes(target, monkeypatch):
    """The fault-injection helper without a fault is a correct verifier: what the two tests above
    detect is the fault, not the helper."""
    import transformers.generation.utils as gen_utils

    monkeypatch.setattr(gen_utils, "_speculative_sampling", wrong_speculative_sampling())
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=True)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) > 1e-3


@pytest.mark.parametrize("kwargs", [{"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 3}])
@pytest.mark.parametrize("policy", [True, False])
def test_sampled_joint_matches_exact_law(target, kwargs, policy):
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=policy, sampled_drafts=False)  # point masses
    processors = [TemperatureLogitsWarper(kwargs["temperature"])]
    if kwargs["top_k"]:
        processors.append(TopKLogitsWarper(kwargs["top_k"]))
    law = exact_joint(target, processors)
    counts = empirical(target, drafter, **kwargs)
    stats = drafter.generation_stats
    assert stats.rounds >= 1 and stats.drafted_tokens >= 2  # drafts really were verified
    assert chi2_pvalue(law, counts) > 1e-3


def test_softmax_as_proposal_is_detected(target, monkeypatch):
    monkeypatch.setattr(cg, "JetSpecCandidateGenerator", SoftmaxAsProposal)
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=False)  # full argmax blocks
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) < 1e-3


def test_sampled_joint_with_int8_drafting_matches_exact_law(target):
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, int8=True)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert drafter.int8_drafting and drafter.generation_stats.drafted_tokens >= 2
    assert chi2_pvalue(law, counts) > 1e-3


def test_sampled_drafts_from_a_restricted_draft_vocabulary_follow_the_exact_law(target):
    """q is zero outside the draft vocabulary (token 1 here): the residual supplies it."""
    drafter = sharp_drafter(target)
    drafter.restrict_draft_vocab([0, 2, 3])
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=True)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert drafter.generation_stats.sampled_drafts >= 1
    assert chi2_pvalue(law, counts) > 1e-3


def test_sharpened_proposals_follow_the_exact_law(target):
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=True, proposal_sharpness=2.5)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert drafter.generation_stats.sampled_drafts >= 1
    assert chi2_pvalue(law, counts) > 1e-3


def test_point_mass_logits_put_all_mass_on_each_token():
    from hf_jetspec.generation.sampled_drafting import point_mass_logits

    logits = point_mass_logits(torch.tensor([2, 0]), 4)
    assert logits.shape == (1, 2, 4)
    assert torch.equal(logits.softmax(-1)[0], torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


def test_speculative_verify_on_hand_numbers():
    """Point mass on d = 1 against p = (0.5, 0.25, 0.25, 0): accepted iff u < p(d) = 0.25; a rejection
    draws from p without d, (2/3, 0, 1/3, 0)."""
    from hf_jetspec.generation.sampled_drafting import point_mass_logits, speculative_verify

    q = point_mass_logits(torch.tensor([1]), 4)[0]
    p = torch.log(torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.0, 0.0, 0.0, 1.0]]))
    tokens, n = speculative_verify(torch.tensor([1]), q, p, uniforms=torch.tensor([0.2, 0.5]))
    assert n == 1 and tokens.tolist() == [1, 3]  # accepted, then the bonus from the second row
    tokens, n = speculative_verify(torch.tensor([1]), q, p, uniforms=torch.tensor([0.3, 0.6]))
    assert n == 0 and tokens.tolist() == [0]  # 0.6 * 1 < 2/3: the residual's first column
    tokens, n = speculative_verify(torch.tensor([1]), q, p, uniforms=torch.tensor([0.3, 0.7]))
    assert n == 0 and tokens.tolist() == [2]  # past 2/3: the third column, never the rejected d
    for u, expected in (([0.2, 0.5], (1, [1, 3])), ([0.3, 0.6], (0, [0])), ([0.3, 0.7], (0, [2]))):
        tokens, n = speculative_verify(torch.tensor([1]), q, p, uniforms=torch.tensor(u), point_masses=True)
        assert (n, tokens.tolist()) == expected  # told q is a point mass: the same decisions without reading q
    # a token the target gives probability 0 is rejected even by a uniform of exactly 0
    tokens, n = speculative_verify(torch.tensor([3]), point_mass_logits(torch.tensor([3]), 4)[0], p, uniforms=torch.tensor([0.0, 0.0]))
    assert n == 0 and tokens.tolist() == [0]


def test_sampled_chain_rounds_verify_through_speculative_verify(target, monkeypatch):
    """Under sampling, argmax drafts reach the verifier as point-mass logits; a verifier whose residual
    forgets the rejected draft (draws from p) breaks the law, and the chi-square test sees it."""
    import hf_jetspec.generation.sampled_drafting as sd

    calls = []
    real = sd.speculative_verify
    monkeypatch.setattr(sd, "speculative_verify", lambda *a, **k: calls.append(1) or real(*a, **k))
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=False)
    target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), assistant_model=drafter, do_sample=True, max_new_tokens=NEW,
                    min_new_tokens=NEW, temperature=1.0, top_k=0)
    assert calls  # the point-mass round went through our verifier
    monkeypatch.setattr(sd, "speculative_verify", verify_without_residual)
    law = exact_joint(target, [TemperatureLogitsWarper(1.0)])
    counts = empirical(target, drafter, temperature=1.0, top_k=0)
    assert chi2_pvalue(law, counts) < 1e-3


def test_speculative_verify_processes_only_the_rows_it_reads():
    """``process_row`` runs once per row, in order, through the row it draws from: drafts (1, 1) on
    rows whose processed form is p = (0.5, 0.25, 0.25, 0); u = 0.2 accepts the first, u = 0.3 rejects
    the second, so row 2 (the bonus row) is never processed. The decisions are those of the
    pre-processed block."""
    from hf_jetspec.generation.sampled_drafting import point_mass_logits, speculative_verify

    processed = torch.log(torch.tensor([0.5, 0.25, 0.25, 0.0])).expand(3, 4).clone()
    raw = torch.zeros(3, 4)  # uniform until processed
    calls = []

    def process_row(i):
        calls.append(i)
        raw[i] = processed[i]

    drafts, u = torch.tensor([1, 1]), torch.tensor([0.2, 0.3, 0.6])
    q = point_mass_logits(drafts, 4)[0]
    lazy = speculative_verify(drafts, q, raw, uniforms=u, point_masses=True, process_row=process_row)
    eager = speculative_verify(drafts, q, processed, uniforms=u, point_masses=True)
    assert calls == [0, 1]
    assert lazy[1] == eager[1] == 1 and lazy[0].tolist() == eager[0].tolist() == [1, 0]
    calls.clear()
    raw.zero_()
    speculative_verify(drafts, q, raw, uniforms=torch.tensor([0.2, 0.2, 0.6]), point_masses=True, process_row=process_row)
    assert calls == [0, 1, 2]  # both accepted: the bonus row is read, so processed


def test_row_pure_accepts_transformers_own_row_processors_only():
    from transformers.generation.logits_process import LogitsProcessor, RepetitionPenaltyLogitsProcessor

    from hf_jetspec.generation.sampled_drafting import row_pure

    class Mine(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores

    class MyTopP(TopPLogitsWarper):
        pass

    assert row_pure([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9),
                     RepetitionPenaltyLogitsProcessor(1.1)])
    assert not row_pure([TemperatureLogitsWarper(0.7), Mine()])
    assert not row_pure([MyTopP(0.9)])  # a subclass may keep state: processed eagerly


def count_top_p_rows(monkeypatch) -> dict:
    """Count the rows top-p processes (``calls["n"]``) from here to the end of the test."""
    calls = {"n": 0}
    real_top_p = TopPLogitsWarper.__call__

    def counting_top_p(self, input_ids, scores):
        calls["n"] += scores.shape[0]
        return real_top_p(self, input_ids, scores)

    monkeypatch.setattr(TopPLogitsWarper, "__call__", counting_top_p)
    return calls


def test_lazily_processed_rounds_sample_the_same_tokens(target, monkeypatch):
    """With the same seed, generation with the processors deferred to the verifier commits the same
    tokens and reports the same scores as with every row processed by transformers, and processes
    fewer rows (the rows after a rejection are skipped)."""
    calls = count_top_p_rows(monkeypatch)
    drafter = sharp_drafter(target)
    drafter.drafting_config = drafter.drafting_config.replace(policy=False, sampled_drafts=False)

    def run():
        outs, calls["n"] = [], 0
        for seed in range(12):
            torch.manual_seed(seed)
            out = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), assistant_model=drafter, do_sample=True,
                                  max_new_tokens=10, min_new_tokens=10, temperature=0.7, top_p=0.95, top_k=0,
                                  output_scores=True, return_dict_in_generate=True)
            outs.append((out.sequences[0].tolist(), torch.stack(out.scores)))
        return outs, calls["n"]

    lazy, lazy_rows = run()
    monkeypatch.setattr(cg, "row_pure", lambda processors: False)
    eager, eager_rows = run()
    assert [seq for seq, _ in lazy] == [seq for seq, _ in eager]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(lazy, eager))
    assert lazy_rows < eager_rows
