"""The transformers ``CandidateGenerator`` that runs JetSpec++ drafting inside ``generate``."""

from __future__ import annotations

import time

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from .drafter_cache import DrafterCache
from .jacobi import initial_block_inputs, jacobi_refine, sample_noise_tokens
from .stats import GenerationStats


class JetSpecCandidateGenerator(CandidateGenerator):
    """Drafts one block per verification round from the target's verified hidden states.

    Protocol with ``_assisted_decoding`` (transformers 5.24): the generator asks for the target's
    hidden states at the drafter's read layers (``model_kwargs_overrides``) and receives the
    previous verification forward's outputs. The first call happens before the prefill, so it
    proposes nothing and lets the target's prefill commit the first token. In every later round the
    first ``n_last_matches + 1`` rows of those outputs are the newly verified positions; they go
    into the drafter's cache, the latest committed token becomes the anchor, and the drafter
    returns ``budget - 1`` argmax draft tokens after J0 and ``num_jacobi_passes`` Jacobi passes.

    No proposal logits are returned, so transformers verifies by exact match: a draft token is kept
    iff it equals the target's own draw (argmax under greedy) at that position. The output is the
    target's, at any temperature and with any logits processor (seed 000, Appendix F.3).
    """

    requires_model_outputs = True

    def __init__(self, target, drafter, generation_config, logits_processor=None):
        drafter.attach_target(target)
        options = drafter.drafting_config
        options.validate()
        self.drafter = drafter
        self.options = options
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.model_kwargs_overrides = {"output_hidden_states": [i + 1 for i in self.layer_ids]}
        self.max_length = generation_config.max_length
        self.cache = DrafterCache(drafter.config.num_hidden_layers)
        self.generator = torch.Generator(device=drafter.device).manual_seed(options.seed)
        self.stats = GenerationStats()
        drafter.generation_stats = self.stats
        self._is_prefill = True
        self._proposed = 0
        self._t_verify_start = time.perf_counter()

    def _new_context_states(self, model_outputs, count: int) -> torch.Tensor:
        hidden = getattr(model_outputs, "hidden_states", None)
        if hidden is None:
            raise RuntimeError("the target did not return hidden states; it cannot serve a JetSpecDrafter")
        return torch.cat([hidden[i + 1][:, :count] for i in self.layer_ids], dim=-1)

    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, n_last_matches=0, **kwargs):
        if is_first_iteration:
            mask = (model_kwargs or {}).get("attention_mask")
            if mask is not None and not bool(mask.all()):
                raise ValueError(
                    "JetSpec drafting needs an unpadded prompt (batch size 1, attention_mask all ones); "
                    "strip the padding before calling generate"
                )
            self._is_prefill = True
            self._proposed = 0
            self._t_verify_start = time.perf_counter()
            return input_ids, None

        t0 = time.perf_counter()
        cur_len = input_ids.shape[1]
        new_rows = cur_len - 1 - len(self.cache)
        if new_rows < 1 or (not self._is_prefill and new_rows != n_last_matches + 1):
            raise RuntimeError(
                f"drafter cache out of sync: {len(self.cache)} cached positions, {cur_len - 1} verified "
                f"positions, {n_last_matches} matches reported"
            )
        states = self._new_context_states(model_outputs, new_rows)
        positions = torch.arange(len(self.cache), cur_len - 1)
        self.drafter.append_context(self.cache, states, positions)
        self._is_prefill = False

        gamma = min(self.options.budget - 1, self.max_length - cur_len - 1)
        if gamma <= 0:
            self._proposed = 0
            self._t_verify_start = time.perf_counter()
            self.stats.draft_time_s += self._t_verify_start - t0
            return input_ids, None

        device = self.drafter.device
        seq = input_ids[0].to(device)
        anchor, context = seq[-1:], seq[:-1]
        noise = sample_noise_tokens(context, gamma - 1, self.generator)
        block = initial_block_inputs(anchor, noise)
        noise_mask = None
        if self.drafter.config.block_inputs == "mask":
            noise_mask = torch.arange(gamma, device=device) > 0

        def draft_fn(inputs, mask=None):
            return self.drafter.draft_block(self.cache, inputs, cur_len - 1, mask)

        draft = draft_fn(block, noise_mask)
        draft, _ = jacobi_refine(draft_fn, anchor, draft, self.options.num_jacobi_passes)

        self._proposed = gamma
        candidates = torch.cat([input_ids, draft.to(input_ids.device, input_ids.dtype)[None]], dim=-1)
        self._t_verify_start = time.perf_counter()
        self.stats.draft_time_s += self._t_verify_start - t0
        return candidates, None

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        elapsed = time.perf_counter() - self._t_verify_start
        n = int(num_matches)
        if self._is_prefill:
            self.stats.prefill_time_s += elapsed
            return
        self.stats.verify_time_s += elapsed
        self.stats.record_round(accepted=n, committed=n + 1, drafted=self._proposed)
