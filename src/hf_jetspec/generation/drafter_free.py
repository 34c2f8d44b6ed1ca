"""Rounds of a :class:`~hf_jetspec.assistant.DrafterFreeAssistant`: n-gram proposals, priced by the round policy.

Each round looks up the sequence's longest n-gram match (else a match in the assistant's earlier
outputs, :func:`~hf_jetspec.policy.propose_ngram`), estimates each proposed position's acceptance
from the running counts of proposals of its kind (source, match length, position), and verifies the
prefix length that maximises expected committed tokens per second under the target's cost model
(:func:`~hf_jetspec.policy.best_candidate`); no proposal worth its price means a plain step. No
hidden states are requested from the target. Under greedy decoding verification is exact match;
under sampling the proposal goes to the verifier as point-mass logits, whose rule accepts token
``x`` with probability ``p(x)`` and otherwise draws from the residual, which is the target's law.
"""

from __future__ import annotations

import time

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ..policy import Candidate, CostModel, NgramIndex, best_candidate, propose_ngram
from ..assistant.lm_source import LM_SOURCE, check_lm_source, propose_priced
from .sampled_drafting import point_mass_logits
from .stats import GenerationStats


class DrafterFreeCandidateGenerator(CandidateGenerator):
    """The candidate generator of a :class:`~hf_jetspec.assistant.DrafterFreeAssistant` (see the module docstring)."""

    requires_model_outputs = False

    def __init__(self, target, assistant, generation_config, logits_processor=None):
        options = assistant.drafting_config
        self.assistant = assistant
        self.options = options
        self.max_length = generation_config.max_length
        self.sampling = bool(generation_config.do_sample)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.logits_processor = logits_processor
        self.defers_processing = False  # the seam's sampling verifier reads this: rows arrive processed
        self.point_mass_logits = None  # the latest point-mass logits (the verifier knows them by identity)
        from .. import policy  # looked up at call time: one profile per target, device and dtype, kept by the policy package

        sizes, seconds = policy.cost_profile_for(target, options.budget)
        self.cost = CostModel(sizes, seconds)
        self.index = NgramIndex(max_ngram=options.max_ngram)
        self.memory = assistant.output_memory if options.output_memory else None
        self.lm = getattr(assistant, "lm_source", None)
        if self.lm is not None:
            check_lm_source(target, self.lm.model)
        self.stats = GenerationStats()
        self._prefill = True  # the first verification forward is the prompt's
        self._choice = None  # (proposal, verified length) of the round under verification
        self._last_ids = None
        self._t_verify = time.perf_counter()

    def get_candidates(self, input_ids, **kwargs):
        t0 = time.perf_counter()
        self.index.extend(input_ids[0, len(self.index.tokens) :].tolist())
        self._last_ids = input_ids
        gamma = min(self.options.budget - 1, self.max_length - input_ids.shape[1] - 1)
        tokens: list[int] = []
        self._choice = None
        lm_chain = None
        if not self._prefill and gamma > 0:
            costs = self.cost.verify_costs(gamma)
            proposal = propose_ngram(self.index, self.memory, gamma)
            candidates = [] if proposal is None else [Candidate("ngram", proposal.tokens, self.assistant.output_memory.accept_probs(proposal))]
            if self.lm is not None:
                free_rate = best_candidate(candidates, costs).choice.rate
                lm_chain, lm_probs = propose_priced(self.lm, input_ids[0], gamma, self.assistant.output_memory.node_calibration, costs,
                                                    self.assistant.output_memory.draft_gate, free_rate,
                                                    [(c.tokens, c.accept_probs) for c in candidates])
                if lm_chain is not None:
                    self.stats.lm_time_s += lm_chain.seconds
                    self.stats.lm_tokens += len(lm_chain.tokens)
                if lm_chain is not None and lm_chain.tokens:
                    candidates.append(Candidate("lm", lm_chain.tokens, lm_probs))
            choice = best_candidate(candidates, costs)
            tokens = choice.tokens
            self._choice = (choice.source, proposal if choice.source == "ngram" else lm_chain, len(tokens)) if tokens else None
            self.stats.chosen_lengths.append(len(tokens))
            self.stats.round_sources.append(choice.source)
        logits = None
        if tokens:
            extra = torch.tensor(tokens, dtype=input_ids.dtype, device=input_ids.device)[None]
            input_ids = torch.cat([input_ids, extra], dim=-1)
            if self.sampling:
                logits = self.point_mass_logits = point_mass_logits(extra[0], self.vocab_size)
        self._t_verify = time.perf_counter()
        self.stats.draft_time_s += self._t_verify - t0
        return input_ids, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        elapsed = time.perf_counter() - self._t_verify
        if self._prefill:
            self._prefill = False
            self.stats.prefill_time_s += elapsed
            return
        accepted = int(num_matches)
        proposed = self._choice[2] if self._choice is not None else 0
        self.stats.verify_time_s += elapsed
        self.stats.record_round(accepted=accepted, committed=accepted + 1, drafted=proposed)
        self.cost.observe_verify(proposed + 1, elapsed)
        if self._choice is not None:
            source, proposal, verified = self._choice
            if source == "lm":
                self.assistant.output_memory.node_calibration.observe_chain(LM_SOURCE, proposal.probs[:verified], accepted)
                self.stats.lm_nodes += verified
                self.stats.lm_accepted += accepted
            else:
                self.assistant.output_memory.observe(proposal, verified=verified, accepted=accepted)
        self._last_ids = input_ids

    def close(self) -> GenerationStats:
        """Remember this call's sequence in the output memory and return the call's statistics."""
        if self.memory is not None and self._last_ids is not None:
            self.memory.add_sequence(self._last_ids[0].tolist())
            self._last_ids = None
        self.stats.cost_model = self.cost.summary(self.options.budget - 1)
        return self.stats
