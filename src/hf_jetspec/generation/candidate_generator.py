"""The transformers ``CandidateGenerator`` that runs JetSpec++ drafting inside ``generate``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ..assistant import assistant_for
from ..assistant.lm_source import LM_SOURCE, check_lm_source, propose_priced
from ..drafter.drafter_cache import gather_pending, trim_pending
from ..drafter.drafting_config import check_context_window
from ..drafter.jacobi import initial_block_inputs, jacobi_refine, sample_noise_tokens
from .sampled_drafting import make_proposal, point_mass_logits, row_pure
from .stats import GenerationStats

CHAIN_SOURCE = "drafter-chain"  # chain rounds' drafted blocks in the running calibration (ScoreCalibration.chain)


class JetSpecCandidateGenerator(CandidateGenerator):
    """Drafts one block per verification round from the target's verified hidden states.

    Protocol with ``_assisted_decoding`` (transformers 5.24): the generator asks for the target's
    hidden states at the drafter's read layers (``model_kwargs_overrides``) and receives the
    previous verification forward's outputs. The first call happens before the prefill, so it
    proposes nothing and lets the target's prefill commit the first token. In every later round the
    first ``n_last_matches + 1`` rows of those outputs are the newly verified positions; they go
    into the drafter's cache, the latest committed token becomes the anchor, and the drafter
    returns ``budget - 1`` argmax draft tokens after J0 and ``num_jacobi_passes`` Jacobi passes.

    Under greedy decoding no proposal logits are returned, so transformers verifies by exact match:
    a draft token is kept iff it equals the target's argmax at that position. Under sampling a
    drafter block is drawn from the final pass's distributions shaped by the target's logits
    processors, and those proposal logits are returned, so transformers verifies with
    ``min(1, p/q)`` and the residual (:mod:`hf_jetspec.generation.sampled_drafting`, where the exactness
    condition is written down); n-gram proposals and argmax drafts stay point masses, returned as
    point-mass logits, which that rule verifies with exact match's law. Either way the output follows
    the target's law (seed 000, Appendix F.3).
    """

    requires_model_outputs = True

    def __init__(self, target, assistant, generation_config, logits_processor=None):
        """``assistant``: the :class:`~hf_jetspec.assistant.JetSpecAssistant` of the call (a bare
        drafter is composed with :func:`~hf_jetspec.assistant.assistant_for`)."""
        assistant = assistant_for(assistant)
        drafter = assistant.drafter
        self.assistant = assistant
        drafter.attach_target(target)
        options = drafter.drafting_config
        options.validate()
        check_context_window(drafter, options)
        self.drafter = drafter
        self.options = options
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.model_kwargs_overrides = {"output_hidden_states": [i + 1 for i in self.layer_ids]}
        self.max_length = generation_config.max_length
        self.do_sample = options.draws_from_q(generation_config)  # drafts drawn from q (else argmax / point masses)
        self.sampling = bool(generation_config.do_sample)  # point masses then go to the verifier as point-mass logits
        self.point_mass_logits = None  # the latest such logits: the verifier knows them by identity and skips reading q
        self.logits_processor = logits_processor
        # under sampling with processors that read only their own row, the verifier applies them lazily
        self._lazy_processing = self.sampling and bool(logits_processor) and row_pure(logits_processor)
        self.defers_processing = False  # this round's rows reach the verifier unprocessed (see seam._DeferredProcessors)
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self._drawn_logits = None  # the proposal logits of this round's sampled drafter block [1, g, V]
        drafter.configure_engine(options)
        self.cache = drafter.new_cache()
        self.generator = torch.Generator(device=drafter.device).manual_seed(options.seed)
        self.stats = GenerationStats()
        self._is_prefill = True
        self._proposed = 0
        self._t_verify_start = time.perf_counter()
        self.engine = None
        self._pending = None
        self._executor = None
        self._stream = None
        self._ctx_len = 0
        self._pending_ctx: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.recorder = None  # set by the seam when an online learner records this call
        self.policy = options.uses_policy
        if assistant.lm_source is not None and not self.policy:
            raise ValueError("an LM source is priced by the round policy: set drafting_config.policy=True (the default) to use one")
        if options.needs_foresight_models:
            self._init_foresight(target)
        if self.policy:
            self._init_policy(target)

    # ------------------------------------------------------------------ foresight set-up
    def _init_foresight(self, target) -> None:
        from ..foresight import ForesightDecoder, ForesightEngine

        attached = self.assistant.foresight
        if attached is None:
            raise ValueError(
                "drafting_config.foresight / num_context_refreshes need a foresight adapter: "
                "assistant_for(drafter).attach_foresight(ForesightAdapter.from_pretrained(...)) (or a folder path)"
            )
        adapter, calibration = attached
        adapter.attach_target(target)
        decoder = ForesightDecoder(target, max(self.layer_ids))
        self.engine = ForesightEngine(self.drafter, adapter, decoder, calibration, self.options)
        wanted = sorted({i + 1 for i in self.layer_ids} | set(decoder.state_indices) | set(adapter.state_indices))
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        mode = self.options.pipeline
        if mode == "auto":  # a worker thread competes with verification for the same CPU cores: in line there
            mode = "stream" if self.drafter.device.type == "cuda" else "off"
        if self.options.foresight and mode in ("thread", "stream"):
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jetspec-foresight")
            if mode == "stream":
                self._stream = torch.cuda.Stream(device=self.drafter.device)

    # ------------------------------------------------------------------ round policy set-up
    def _init_policy(self, target) -> None:
        from ..policy import CostModel, NgramIndex, cost_profile_for

        opts = self.options
        sizes, seconds = cost_profile_for(target, opts.budget)
        self.cost = CostModel(sizes, seconds)
        self.gate = self.assistant.output_memory.draft_gate("chain")
        self.index = NgramIndex(max_ngram=opts.max_ngram)
        self.memory = self.assistant.output_memory if opts.output_memory else None
        self.acceptance = self.assistant.acceptance_model_for(self.do_sample)
        self._last_choice = None
        self._last_ids = None
        self._record = None
        self._drafted_raw = None  # the raw conditional estimates of this round's drafted block
        self.lm = self.assistant.lm_source
        self._lm_chain = None  # this round's LM chain
        if self.lm is not None:
            check_lm_source(target, self.lm.model)

    def _foresight_job(self, *args, ready=None, **kwargs):
        t0 = time.perf_counter()
        if self._stream is not None:
            if ready is not None:  # start after the drafting work the main stream queued before verification
                self._stream.wait_event(ready)
            with torch.cuda.stream(self._stream):
                out = self.engine.predraft(*args, **kwargs)
                event = torch.cuda.Event()
                event.record(self._stream)
            return out, event, time.perf_counter() - t0
        return self.engine.predraft(*args, **kwargs), None, time.perf_counter() - t0

    def _launch(self, *args, **kwargs) -> None:
        if self._executor is None:  # pipeline "off": in line, before the block is verified
            try:
                self._pending = self._foresight_job(*args, **kwargs)
            except Exception:
                self.stats.worker_failures += 1
                self._pending = None
        else:
            ready = None
            if self._stream is not None:
                ready = torch.cuda.Event()
                ready.record()
            self._pending = self._executor.submit(self._foresight_job, *args, ready=ready, **kwargs)

    def _collect(self):
        """Wait for the foresight work of the previous round; a failure only means a miss."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            result = pending.result() if hasattr(pending, "result") else pending
        except Exception:
            self.stats.worker_failures += 1
            return None
        (spec, record), event, busy = result
        if event is not None:
            torch.cuda.current_stream(self.drafter.device).wait_event(event)
        self.stats.background_time_s += busy
        return spec, record

    def close(self) -> GenerationStats:
        """Stop the foresight worker, store what this call taught the round policy, return the statistics."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if self.policy:
            if self.memory is not None and self._last_ids is not None:
                self.memory.add_sequence(self._last_ids[0].tolist())
                self._last_ids = None
            self.stats.cost_model = self.cost.summary(self.options.budget - 1)
        return self.stats

    def _new_context_states(self, model_outputs, count: int) -> list[torch.Tensor]:
        """Views of the newly verified rows of each read layer [1, count, H] (nothing copied: the
        drafter concatenates them only if it runs)."""
        hidden = getattr(model_outputs, "hidden_states", None)
        if hidden is None:
            raise RuntimeError("the target did not return hidden states; it cannot serve a JetSpecDrafter")
        return [hidden[i + 1][:, :count] for i in self.layer_ids]

    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False, n_last_matches=0, **kwargs):
        candidates, logits = self._candidates(input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches)
        # a round with candidate logits under sampling is verified by speculative_verify, which applies the
        # target's processors to the rows it reads; any other round is processed by transformers as usual
        self.defers_processing = self._lazy_processing and logits is not None
        return candidates, logits

    def _candidates(self, input_ids, model_kwargs, model_outputs, is_first_iteration, n_last_matches):
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
        new_rows = cur_len - 1 - self._ctx_len
        if new_rows < 1 or (not self._is_prefill and new_rows != n_last_matches + 1):
            raise RuntimeError(
                f"drafter cache out of sync: {self._ctx_len} cached positions, {cur_len - 1} verified "
                f"positions, {n_last_matches} matches reported"
            )
        # wait for the foresight worker before touching any cache it reads
        pending = self._collect() if self.engine is not None else None
        states = self._new_context_states(model_outputs, new_rows)
        if self.recorder is not None:  # an online learner keeps the verified states
            self.recorder.add(states)
        positions = torch.arange(self._ctx_len, cur_len - 1)
        self._ctx_len = cur_len - 1
        if self.policy:  # the drafter cache is filled only when the drafter runs
            self._pending_ctx.append((states, positions))
            trim_pending(self._pending_ctx, self.options.effective_context_window)
        else:
            self.drafter.append_context(self.cache, states, positions, window=self.options.effective_context_window)
        if self.engine is not None:
            self.engine.observe(torch.cat(states, dim=-1), model_outputs.hidden_states, new_rows, positions)
        self._is_prefill = False

        gamma = min(self.options.budget - 1, self.max_length - cur_len - 1)
        if gamma <= 0:  # the last token before max_length: a plain step
            self._proposed = 0
            if self.policy:
                self._take(None, None)
            self._t_verify_start = time.perf_counter()
            self.stats.draft_time_s += self._t_verify_start - t0
            return input_ids, None

        device = self.drafter.device
        seq = input_ids[0].to(device)
        anchor, context = seq[-1:], seq[:-1]
        if self.policy:
            tokens = self._policy_round(input_ids, anchor, context, gamma, cur_len)
            self._proposed = len(tokens)
            candidates = input_ids
            if tokens:
                extra = torch.tensor(tokens, dtype=input_ids.dtype, device=input_ids.device)[None]
                candidates = torch.cat([input_ids, extra], dim=-1)
            proposal, self._drawn_logits = self._drawn_logits, None
            if proposal is None and tokens and self.sampling:
                proposal = self.point_mass_logits = point_mass_logits(extra[0], self.vocab_size)
            self._t_verify_start = time.perf_counter()
            self.stats.draft_time_s += self._t_verify_start - t0
            return candidates, proposal
        if self.engine is None:
            draft, logits = self._draft(anchor, context, gamma, cur_len)
            proposal = None
            if self.do_sample:
                draft, proposal = self._sample(self._proposal(logits, input_ids))
        else:
            draft, proposal = self._draft_with_foresight(anchor, context, gamma, cur_len, pending, n_last_matches, input_ids)

        self._proposed = draft.numel()
        if proposal is None and self.sampling and draft.numel():
            proposal = self.point_mass_logits = point_mass_logits(draft.to(input_ids.device), self.vocab_size)
        candidates = torch.cat([input_ids, draft.to(input_ids.device, input_ids.dtype)[None]], dim=-1)
        self._t_verify_start = time.perf_counter()
        self.stats.draft_time_s += self._t_verify_start - t0
        return candidates, proposal

    def _sample(self, q):
        """Draw the block from its proposal in one go: ``(draft [g], proposal logits [1, g, V])``,
        verified by transformers with ``min(1, p/q)`` and the residual."""
        self.stats.sampled_drafts += 1
        return q.sample(), q.dense_logits()[None]

    def _proposal(self, logits, input_ids):
        """The proposal of a drafted block (:func:`~hf_jetspec.generation.sampled_drafting.make_proposal`) from
        its final pass's draft-vocabulary logits [g, V_draft], cut before the first empty row."""
        q = make_proposal(logits, self.drafter.draft_vocab_ids, self.vocab_size, input_ids.to(logits.device), self.logits_processor,
                          self.options.proposal_sharpness)
        return q.truncate(q.usable_rows())

    def _j0_inputs(self, anchor, context, gamma, seed=()):
        """J0 block inputs: the anchor, the ``seed`` tokens (an n-gram continuation), then noise; and
        the mask of noise positions for mask-input drafters."""
        seed = torch.tensor(list(seed[: gamma - 1]), dtype=anchor.dtype, device=anchor.device)
        noise = sample_noise_tokens(context, gamma - 1 - seed.numel(), self.generator)
        block = initial_block_inputs(anchor, torch.cat([seed, noise]))
        noise_mask = None
        if self.drafter.config.block_inputs == "mask":
            noise_mask = torch.arange(gamma, device=self.drafter.device) > seed.numel()
        return block, noise_mask

    def _j0(self, anchor, context, gamma, cur_len):
        block, noise_mask = self._j0_inputs(anchor, context, gamma)
        return self.drafter.draft_block(self.cache, block, cur_len - 1, noise_mask, return_logits=True)

    def _draft(self, anchor, context, gamma, cur_len):
        """J0 and J Jacobi passes (no foresight models): the argmax draft and the final pass's logits."""
        draft, logits = self._j0(anchor, context, gamma, cur_len)
        self.stats.drafter_runs += 1
        last = {"logits": logits}

        def draft_fn(inputs):
            new, last["logits"] = self.drafter.draft_block(self.cache, inputs, cur_len - 1, return_logits=True)
            return new

        draft, _ = jacobi_refine(draft_fn, anchor, draft, self.options.num_jacobi_passes)
        return draft, last["logits"]

    def _draft_with_foresight(self, anchor, context, gamma, cur_len, pending, n_last_matches, input_ids):
        """A cached block on a hit, else a drafted one; then launch foresight for the next round.
        Returns ``(draft, proposal logits or None)``; under sampling the block is drawn from its final
        logits before the launch, so pre-drafting conditions on the block as verified."""
        opts = self.options
        draft = logits = None
        if opts.foresight and pending is not None:
            spec, record = pending
            outcome = (int(n_last_matches), int(anchor))
            block = spec.lookup(*outcome)
            hit = block is not None and block.tokens.numel() >= gamma
            self.stats.cache_lookups += 1
            self.stats.cache_hits += int(hit)
            self.stats.outcomes.append(outcome)
            if record is not None:
                record.realized, record.hit = outcome, hit
                self.stats.foresight_records.append(record)
            if hit:
                draft = block.tokens[:gamma].to(anchor.device)
                logits = block.logits[:gamma]
        if draft is None:
            draft, logits = self._j0(anchor, context, gamma, cur_len)
            if not opts.foresight or pending is None:
                # ordinary round (no foresight, or the first round): J passes with R refreshes
                tokens = torch.cat([anchor, draft.to(anchor.device)])
                tokens, logits = self.engine.refine(
                    self.cache, tokens, cur_len - 1, logits, opts.num_jacobi_passes, opts.num_context_refreshes, stats=self.stats
                )
                draft = tokens[1:]
        proposal = None
        if self.do_sample:
            draft, proposal = self._sample(self._proposal(logits, input_ids))
        if opts.foresight:
            tokens = torch.cat([anchor, draft.to(anchor.device)])
            self._launch(self.cache, tokens, cur_len - 1, logits[: draft.numel()], context, record=opts.record_rounds)
        return draft, proposal

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        elapsed = time.perf_counter() - self._t_verify_start
        n = int(num_matches)
        if self.recorder is not None and scores is not None:  # the verified rows' distributions, an online learner's labels
            self.recorder.add_labels(input_ids.shape[1] - n - 2, scores[0, : n + 1])
        if self._is_prefill:
            self.stats.prefill_time_s += elapsed
            return
        self.stats.verify_time_s += elapsed
        self.stats.record_round(accepted=n, committed=n + 1, drafted=self._proposed)
        if self.policy:
            self._after_policy_round(input_ids, n, elapsed)

    # ------------------------------------------------------------------ the round policy
    def _flush_context(self) -> None:
        """Bring the drafter cache up to date with the verified positions it has not seen yet."""
        if not self._pending_ctx:
            return
        window = self.options.effective_context_window
        states, positions = gather_pending(self._pending_ctx, window)
        self._pending_ctx.clear()
        self.drafter.append_context(self.cache, states, positions, window=window)

    def _scored_draft(self, anchor, context, gamma, cur_len, seed_tokens, input_ids=None):
        """J0 (seeded by ``seed_tokens`` where given, noise after) and the Jacobi passes.

        Returns ``(draft [gamma] on CPU, features [gamma, 4], passes run, proposal logits or None)``.
        A position's ``agreed`` feature says whether the final pass returned the token that position
        held in its inputs (the previous pass's draft, or the seed). Under sampling every pass keeps
        its logits, the final pass's through the target's processors are the proposal ``q`` (the
        block is drawn from it only after the policy has chosen, see :meth:`_policy_round`), the
        top-1 feature is ``q``'s and the draft is cut before any row ``q`` cannot define."""
        from ..policy import acceptance_features

        drafter = self.drafter
        sampling = self.do_sample

        def run(block, mask=None):
            if sampling:
                return drafter.draft_block(self.cache, block, cur_len - 1, mask, return_logits=True)
            return drafter.draft_block_summary(self.cache, block, cur_len - 1, mask)

        inputs, noise_mask = self._j0_inputs(anchor, context, gamma, seed_tokens)
        draft, head = run(inputs, noise_mask)
        passes = 1
        for _ in range(self.options.num_jacobi_passes):
            new_inputs = torch.cat([anchor, draft[:-1]])
            if torch.equal(new_inputs, inputs):
                break  # a fixed point: another pass returns the same draft
            inputs = new_inputs
            draft, head = run(inputs)
            passes += 1
        q = None
        if sampling:
            q = self._proposal(head, input_ids)
            top1 = q.top1()
            draft = draft[: len(q)]
        else:
            top1 = head.top1_prob
        agreed = torch.zeros(draft.numel(), dtype=torch.bool, device=draft.device)
        agreed[:-1] = draft[:-1] == inputs[1 : draft.numel()]
        return draft.cpu(), acceptance_features(top1.cpu(), agreed.cpu()), passes, q

    def _policy_round(self, input_ids, anchor, context, gamma, cur_len) -> list[int]:
        """Choose this round's candidate (see :mod:`hf_jetspec.policy`) and return its tokens."""
        from ..policy import (AcceptanceRecord, Candidate, RoundChoice, VerifyChoice, best_candidate, choose_verify_length,
                              propose_ngram)

        opts = self.options
        self.index.extend(input_ids[0, len(self.index.tokens) :].tolist())
        costs = self.cost.verify_costs(gamma)
        proposal = propose_ngram(self.index, self.memory, gamma) if opts.ngram or opts.ngram_seed else None
        candidates = []
        free_rate = 1.0 / costs[0]
        if proposal is not None and opts.ngram:
            probs = self.assistant.output_memory.accept_probs(proposal)
            candidates.append(Candidate("ngram", proposal.tokens, probs))
            free_rate = max(free_rate, choose_verify_length(probs, costs).rate)
        self._lm_chain = None
        lm_seeds = [(c.tokens, c.accept_probs) for c in candidates]  # the n-gram continuation, and the drafter's block below
        record = opts.record_acceptance
        passes_cost = self.cost.draft_cost(1 + opts.num_jacobi_passes)
        self.gate.limit_probe_cost(passes_cost, costs[0])
        if record or self.gate.should_draft():
            self._flush_context()  # rows of earlier plain rounds: paid once, not a price of every pass
            t0 = time.perf_counter()
            seed = proposal.tokens if (proposal is not None and opts.ngram_seed) else []
            draft, features, passes, q = self._scored_draft(anchor, context, gamma, cur_len, seed, input_ids)
            self.cost.observe_draft(passes, time.perf_counter() - t0)
            self.stats.drafter_runs += 1
            self.stats.seeded_drafter_runs += int(bool(seed))
            raw = self.acceptance.accept_probs(features).tolist()
            # what verification has observed of this assistant's drafted blocks corrects the estimates
            probs = self.assistant.output_memory.node_calibration.chain(CHAIN_SOURCE, raw)
            self._drafted_raw = raw
            value = choose_verify_length(probs, costs, draft_cost=passes_cost, min_length=1).rate
            self.gate.observe(value, free_rate)
            candidates.append(Candidate("drafter", draft.tolist(), probs))
            lm_seeds.append((draft.tolist(), probs))  # the LM continues the likelier of the two where it agrees
            if record:  # calibration rounds verify the whole drafted block
                self._record = AcceptanceRecord(features.tolist(), accepted=0, verified=draft.numel())
                return self._take(self._drawn(RoundChoice("drafter", draft.tolist(), VerifyChoice(draft.numel(), 1.0, 1.0)), q), proposal)
        else:
            self.gate.skipped()
            q = None
        if self.lm is not None:
            t_lm = time.perf_counter()
            self._lm_chain, lm_probs = propose_priced(self.lm, input_ids[0], gamma, self.assistant.output_memory.node_calibration, costs,
                                                      self.assistant.output_memory.draft_gate, free_rate, lm_seeds)
            self.stats.lm_time_s += time.perf_counter() - t_lm
            if self._lm_chain is not None and self._lm_chain.tokens:
                self.stats.lm_tokens += len(self._lm_chain.tokens)
                candidates.append(Candidate("lm", self._lm_chain.tokens, lm_probs))
        return self._take(self._drawn(best_candidate(candidates, costs), q), proposal)

    def _drawn(self, choice, q):
        """Under sampling, a chosen drafter block of length ``L`` is drawn now from ``q[:L]``: source and
        length were fixed from the pass's numbers before the draw, as exactness requires."""
        from ..policy import RoundChoice

        if q is None or choice.source != "drafter":
            return choice
        tokens, self._drawn_logits = self._sample(q.truncate(len(choice.tokens)))
        return RoundChoice(choice.source, tokens.tolist(), choice.choice)

    def _take(self, choice, proposal) -> list[int]:
        """Record the round's choice (None: a plain step outside the policy's control) and return its tokens."""
        self._last_choice = None if choice is None else (choice, proposal)
        self.stats.chosen_lengths.append(0 if choice is None else choice.choice.length)
        self.stats.round_sources.append("plain" if choice is None else choice.source)
        return [] if choice is None else choice.tokens

    def _after_policy_round(self, input_ids, accepted: int, elapsed: float) -> None:
        self._last_ids = input_ids
        self.cost.observe_verify(self._proposed + 1, elapsed)
        if self._last_choice is None:
            return
        choice, proposal = self._last_choice
        if choice.source == "ngram" and proposal is not None:
            self.assistant.output_memory.observe(proposal, verified=self._proposed, accepted=accepted)
        if choice.source == "lm" and self._lm_chain is not None:
            self.assistant.output_memory.node_calibration.observe_chain(LM_SOURCE, self._lm_chain.probs[: self._proposed], accepted)
            self.stats.lm_nodes += self._proposed
            self.stats.lm_accepted += accepted
        if choice.source == "drafter" and self._drafted_raw is not None:
            self.assistant.output_memory.node_calibration.observe_chain(CHAIN_SOURCE, self._drafted_raw[: self._proposed], accepted)
        if self._record is not None:
            self._record.accepted = accepted
            self.stats.acceptance_records.append(self._record)
            self._record = None
