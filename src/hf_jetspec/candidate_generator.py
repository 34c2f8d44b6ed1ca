"""The transformers ``CandidateGenerator`` that runs JetSpec++ drafting inside ``generate``."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

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
        self.engine = None
        self._pending = None
        self._executor = None
        self._stream = None
        if options.needs_foresight_models:
            self._init_foresight(target)
        drafter.__dict__["_active_generator"] = self

    # ------------------------------------------------------------------ foresight set-up
    def _init_foresight(self, target) -> None:
        from .foresight import ForesightDecoder, ForesightEngine

        attached = self.drafter.foresight
        if attached is None:
            raise ValueError(
                "drafting_config.foresight / num_context_refreshes need a foresight adapter: "
                "drafter.attach_foresight(ForesightAdapter.from_pretrained(...)) (or a folder path)"
            )
        adapter, calibration = attached
        adapter.attach_target(target)
        decoder = ForesightDecoder(target, max(self.layer_ids))
        self.engine = ForesightEngine(self.drafter, adapter, decoder, calibration, self.options)
        wanted = sorted({i + 1 for i in self.layer_ids} | set(decoder.state_indices) | set(adapter.state_indices))
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        mode = self.options.pipeline
        if mode == "auto":
            mode = "stream" if self.drafter.device.type == "cuda" else "thread"
        if self.options.foresight and mode in ("thread", "stream"):
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jetspec-foresight")
            if mode == "stream":
                self._stream = torch.cuda.Stream(device=self.drafter.device)

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

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

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
        # wait for the foresight worker before touching any cache it reads
        pending = self._collect() if self.engine is not None else None
        states = self._new_context_states(model_outputs, new_rows)
        positions = torch.arange(len(self.cache), cur_len - 1)
        self.drafter.append_context(self.cache, states, positions)
        if self.engine is not None:
            self.engine.observe(states, model_outputs.hidden_states, new_rows, positions)
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
        if self.engine is None:
            draft = self._draft(anchor, context, gamma, cur_len)
        else:
            draft = self._draft_with_foresight(anchor, context, gamma, cur_len, pending, n_last_matches)

        self._proposed = gamma
        candidates = torch.cat([input_ids, draft.to(input_ids.device, input_ids.dtype)[None]], dim=-1)
        self._t_verify_start = time.perf_counter()
        self.stats.draft_time_s += self._t_verify_start - t0
        return candidates, None

    def _j0(self, anchor, context, gamma, cur_len):
        noise = sample_noise_tokens(context, gamma - 1, self.generator)
        block = initial_block_inputs(anchor, noise)
        noise_mask = None
        if self.drafter.config.block_inputs == "mask":
            noise_mask = torch.arange(gamma, device=self.drafter.device) > 0
        return self.drafter.draft_block(self.cache, block, cur_len - 1, noise_mask, return_logits=True)

    def _draft(self, anchor, context, gamma, cur_len):
        """J0 and J Jacobi passes (no foresight models)."""
        draft, _ = self._j0(anchor, context, gamma, cur_len)

        def draft_fn(inputs):
            return self.drafter.draft_block(self.cache, inputs, cur_len - 1)

        draft, _ = jacobi_refine(draft_fn, anchor, draft, self.options.num_jacobi_passes)
        return draft

    def _draft_with_foresight(self, anchor, context, gamma, cur_len, pending, n_last_matches):
        """A cached block on a hit, else a drafted one; then launch foresight for the next round."""
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
        if opts.foresight:
            tokens = torch.cat([anchor, draft.to(anchor.device)])
            self._launch(self.cache, tokens, cur_len - 1, logits, context, record=opts.record_rounds)
        return draft

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        elapsed = time.perf_counter() - self._t_verify_start
        n = int(num_matches)
        if self._is_prefill:
            self.stats.prefill_time_s += elapsed
            return
        self.stats.verify_time_s += elapsed
        self.stats.record_round(accepted=n, committed=n + 1, drafted=self._proposed)
