"""The one seam between hf_jetspec and transformers' private generation code.

transformers 5.24 picks a ``CandidateGenerator`` inside ``GenerationMixin._get_candidate_generator``
from a fixed list of conditions and offers no public hook. This module wraps that method with a dispatch
on the assistant's class: a :class:`~hf_jetspec.JetSpecDrafter` (or its
:class:`~hf_jetspec.assistant.JetSpecAssistant`) gets a
:class:`~hf_jetspec.generation.candidate_generator.JetSpecCandidateGenerator`; every other call goes to the
original method unchanged. Two more private methods are wrapped with the same dispatch and nothing
else: ``_validate_generation_mode`` (JetSpec-specific errors before generic ones) and
``_assisted_decoding`` (the output is cut at the first token where a stopping criterion fires, as
plain decoding would stop; see :mod:`hf_jetspec.generation.stopping`). One private function is
wrapped too: ``transformers.generation.utils._speculative_sampling``, which chain rounds under sampling
reach only while a JetSpec call runs (:func:`~hf_jetspec.generation.sampled_drafting.speculative_verify`,
which applies the target's logits processors itself to the rows it reads; :class:`_DeferredProcessors`
lets those rounds through transformers' per-row processing loop unchanged). While a JetSpec call runs, a CPU target
with SDPA attention attends through :mod:`hf_jetspec.generation.gqa_attention` (a public ``AttentionInterface``
registration, switched back afterwards). :func:`install` runs on ``import hf_jetspec``; :func:`uninstall`
restores the originals.
"""

from __future__ import annotations

import functools
import threading
import time

import torch

from transformers.generation import utils as generation_utils
from transformers.generation.utils import GenerationMixin, GenerationMode
from transformers.utils import logging

logger = logging.get_logger(__name__)

_ORIGINALS: dict[str, object] = {}
_CALLS = threading.local()  # per thread: a stack of the JetSpec generators of each running _assisted_decoding


def _running_calls() -> list[list]:
    if not hasattr(_CALLS, "stack"):
        _CALLS.stack = []
    return _CALLS.stack


def _is_drafter(model) -> bool:
    """A JetSpec assistant: a :class:`~hf_jetspec.JetSpecDrafter`, a
    :class:`~hf_jetspec.assistant.JetSpecAssistant` or a :class:`~hf_jetspec.assistant.DrafterFreeAssistant`."""
    from ..assistant import DrafterFreeAssistant, JetSpecAssistant
    from ..drafter.modeling_drafter import JetSpecDrafter

    return isinstance(model, (JetSpecDrafter, JetSpecAssistant, DrafterFreeAssistant))


def _is_drafter_free(model) -> bool:
    from ..assistant import DrafterFreeAssistant

    return isinstance(model, DrafterFreeAssistant)


def _wrap_get_candidate_generator(original):
    @functools.wraps(original)
    def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs, assistant_model=None, *args, **kwargs):
        if _is_drafter(assistant_model):
            from .candidate_generator import JetSpecCandidateGenerator
            from .drafter_free import DrafterFreeCandidateGenerator

            processors = logits_processor.processors if isinstance(logits_processor, _DeferredProcessors) else logits_processor
            kind = DrafterFreeCandidateGenerator if _is_drafter_free(assistant_model) else JetSpecCandidateGenerator
            generator = kind(self, assistant_model, generation_config, processors)
            calls = _running_calls()
            if calls:  # handed to the running _assisted_decoding, which closes it and publishes its statistics
                calls[-1].append(generator)
                generator.recorder = calls[-1].recorder  # an online learner's, or None
            return generator
        return original(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs, assistant_model, *args, **kwargs)

    return _get_candidate_generator


def _wrap_validate_generation_mode(original):
    @functools.wraps(original)
    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        drafter = generation_mode_kwargs.get("assistant_model")
        if _is_drafter(drafter):
            from ..assistant import assistant_for

            if _is_drafter_free(drafter):
                drafter.check_target(self)
            else:
                assistant_for(drafter).drafter.check_target(self)
            kind = type(drafter).__name__
            if generation_mode != GenerationMode.ASSISTED_GENERATION:
                raise ValueError(
                    f"a {kind} speeds up greedy decoding and sampling with num_beams=1; "
                    f"these generation settings select {generation_mode}, which speculative decoding does not support"
                )
            if generation_mode_kwargs.get("assistant_tokenizer") is not None:
                raise ValueError(f"a {kind} uses the target's own tokenizer: do not pass assistant_tokenizer")
            if getattr(generation_config, "assistant_ensemble_weight", None) is not None:
                raise ValueError("assistant_ensemble_weight relaxes verification away from the target's distribution; "
                                 f"a {kind} keeps the output exact and does not support it")
            if generation_config.speculation_type not in (None, "dflash"):
                raise ValueError(f"speculation_type={generation_config.speculation_type!r} is not used with a {kind}")
        return original(self, generation_mode, generation_config, generation_mode_kwargs)

    return _validate_generation_mode


def _wrap_assisted_decoding(original):
    @functools.wraps(original)
    def _assisted_decoding(self, input_ids, *args, **kwargs):
        if not _is_drafter(kwargs.get("assistant_model")):
            return original(self, input_ids, *args, **kwargs)
        from .gqa_attention import masked_gqa

        with masked_gqa(self):  # verification forwards attend over grouped heads without copying the cache
            return _jetspec_decoding(original, self, input_ids, *args, **kwargs)

    return _assisted_decoding


class _Call(list):
    """One running JetSpec ``_assisted_decoding``: its generators, and the recorder of an online learner."""

    recorder = None


def _jetspec_decoding(original, self, input_ids, *args, **kwargs):
    """``_assisted_decoding`` with a JetSpec drafter: tree rounds in our own loop, chain rounds in
    transformers' (the generator's statistics handed to the drafter), cut at the first stop. With an
    online learner on the assistant, the call is counted in flight (no weight swap inside it), its
    verified states are recorded, and the learner takes them when it ends."""
    drafter = kwargs.get("assistant_model")
    learner = None
    if not _is_drafter_free(drafter):
        from ..assistant import assistant_for

        learner = assistant_for(drafter).online_learner
    if learner is None:
        return _decode(original, self, input_ids, None, *args, **kwargs)
    if input_ids.shape[0] > 1:
        raise ValueError("online learning records one sequence at a time: stop_learning() before batched generate")
    recorder = learner.begin_call(self)
    t0 = time.perf_counter()
    result = None
    try:
        result = _decode(original, self, input_ids, recorder, *args, **kwargs)
    finally:
        sequences = None if result is None else (result if isinstance(result, torch.Tensor) else result.sequences)
        learner.end_call(sequences, recorder, input_ids.shape[1], time.perf_counter() - t0)
    return result


def _decode(original, self, input_ids, recorder, *args, **kwargs):
    drafter = kwargs.get("assistant_model")
    reason = None if _is_drafter_free(drafter) else drafter.drafting_config.tree_fallback_reason
    if reason is not None:
        logger.warning_once(f"hf_jetspec: tree={drafter.drafting_config.tree!r} falls back to chain rounds: {reason}")
    if input_ids.shape[0] > 1 and not args:  # several prompts: our own batched loop
        if not _is_drafter_free(drafter):
            from ..assistant import assistant_for

            drafter = assistant_for(drafter)
        if drafter.drafting_config.compiled_rounds:
            raise ValueError("compiled rounds run one sequence at a time: set compiled_rounds=False for batched generate")
        if getattr(drafter, "lm_source", None) is not None:
            raise ValueError("an LM source proposes for one sequence at a time: detach it (attach_lm_source(None)) for batched generate")
        from .batched_decoding import batched_decoding

        names = ("logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer", "inputs_tensor",
                 "assistant_model", "assistant_tokenizer", "tokenizer")
        given = {name: kwargs.pop(name, None) for name in names}
        return batched_decoding(self, input_ids, given["logits_processor"], given["stopping_criteria"], given["generation_config"],
                                given["streamer"], drafter, kwargs)
    if _is_drafter_free(drafter):
        trees = drafter.drafting_config.tree and not args
    else:
        trees = drafter.drafting_config.tree_rounds_for(kwargs.get("generation_config"), input_ids.shape[1]) and not args
    compiled = drafter.drafting_config.compiled_rounds
    if trees and not compiled:  # compiled rounds bring their own static cache
        from .tree_decoding import tree_cache_reason

        reason = tree_cache_reason(kwargs.get("cache"))
        if reason is not None:
            if not _is_drafter_free(drafter):  # the drafter-free default: chains on such targets, as documented
                logger.warning_once(f"hf_jetspec: tree rounds need a dynamic full-attention cache; this target {reason}: chain rounds")
            trees = False
    if trees:  # tree rounds: our own verification loop
        names = ("logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer", "inputs_tensor",
                 "assistant_model", "assistant_tokenizer", "tokenizer")
        given = {name: kwargs.pop(name, None) for name in names}
        if _is_drafter_free(drafter):
            from .ngram_tree import ngram_tree_decoding

            return ngram_tree_decoding(self, input_ids, given["logits_processor"], given["stopping_criteria"], given["generation_config"],
                                       given["streamer"], drafter, kwargs)
        from .tree_decoding import tree_decoding

        return tree_decoding(self, input_ids, given["logits_processor"], given["stopping_criteria"], given["generation_config"],
                             given["streamer"], drafter, kwargs, recorder=recorder)
    generators = _Call()
    generators.recorder = recorder
    config = kwargs.get("generation_config")
    if config is not None and config.do_sample and kwargs.get("logits_processor") is not None:
        kwargs["logits_processor"] = _DeferredProcessors(kwargs["logits_processor"], generators)
    _running_calls().append(generators)
    try:
        result = original(self, input_ids, *args, **kwargs)
    finally:
        _running_calls().pop()
        assistant = kwargs.get("assistant_model")
        for generator in generators:  # only JetSpec generators are registered: stop the worker, hand over the statistics
            assistant.generation_stats = generator.close()
    criteria = kwargs.get("stopping_criteria")
    if criteria is None:
        return result
    from .stopping import first_stop_length, truncate_generate_output

    sequences = result if isinstance(result, torch.Tensor) else result.sequences
    keep = first_stop_length(sequences, input_ids.shape[1], criteria)
    return result if keep == sequences.shape[1] else truncate_generate_output(result, keep, input_ids.shape[1])


class _DeferredProcessors:
    """The target's logits processors as transformers' chain loop sees them under sampling.

    transformers applies the processors to every row of the verified block before verification; a
    block rejected at its first rows discards the rest (a top-p sort of the whole vocabulary each).
    While the round's generator says ``defers_processing`` (its candidate logits go to
    :func:`~hf_jetspec.generation.sampled_drafting.speculative_verify` and its processors read only
    their own row), a call returns the row unchanged and the verifier applies the same processors, to
    the same rows with the same input ids and in the same order, up to the row it draws from. Every
    other call (the prefill, plain rounds, other processors) is the list's own."""

    def __init__(self, processors, generators: list):
        self.processors = processors
        self._generators = generators

    def __len__(self) -> int:
        return len(self.processors)

    def __iter__(self):
        return iter(self.processors)

    def __call__(self, input_ids, scores, **kwargs):
        if self._generators and self._generators[-1].defers_processing:
            return scores
        return self.processors(input_ids, scores, **kwargs)


def _wrap_speculative_sampling(original):
    """transformers' chain verifier under sampling (a module function it calls by name): while a JetSpec
    chain call runs on this thread, :func:`~hf_jetspec.generation.sampled_drafting.speculative_verify`
    (the same algorithm with a strict acceptance test); otherwise the original."""

    @functools.wraps(original)
    def _speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, assistant_ensemble_weight=None):
        if not _running_calls() or assistant_ensemble_weight is not None:
            return original(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                            assistant_ensemble_weight=assistant_ensemble_weight)
        from .sampled_drafting import speculative_verify

        generators = _running_calls()[-1]
        # the generator's own point-mass logits (the same tensor): q is known, not read
        point_masses = bool(generators) and getattr(generators[-1], "point_mass_logits", None) is candidate_logits
        process_row = None
        if generators and generators[-1].defers_processing:  # the rows arrive unprocessed (_DeferredProcessors)
            processors, start = generators[-1].logits_processor, candidate_input_ids.shape[1] - candidate_length

            def process_row(i: int) -> None:  # transformers' own step, for one row
                new_logits[:, i, :] = processors(candidate_input_ids[:, :start + i], new_logits[:, i, :])

        tokens, n = speculative_verify(candidate_input_ids[0, -candidate_length:], candidate_logits[0], new_logits[0],
                                       point_masses=point_masses, process_row=process_row)
        return tokens.to(candidate_input_ids.device, candidate_input_ids.dtype)[None], torch.tensor(n)

    return _speculative_sampling


_WRAPPERS = {
    "_get_candidate_generator": _wrap_get_candidate_generator,
    "_validate_generation_mode": _wrap_validate_generation_mode,
    "_assisted_decoding": _wrap_assisted_decoding,
}
_MODULE_WRAPPERS = {"_speculative_sampling": _wrap_speculative_sampling}  # functions of transformers.generation.utils


def install() -> None:
    """Route ``generate(assistant_model=<JetSpecDrafter>)`` to the JetSpec generator (idempotent)."""
    for name, wrap in _WRAPPERS.items():
        if name in _ORIGINALS:
            continue
        original = getattr(GenerationMixin, name, None)
        if original is None:
            raise ImportError(
                f"transformers.GenerationMixin has no {name}: this transformers version is not supported "
                "by hf_jetspec (tested with 5.24)"
            )
        _ORIGINALS[name] = original
        setattr(GenerationMixin, name, wrap(original))
    for name, wrap in _MODULE_WRAPPERS.items():
        key = f"utils.{name}"
        if key in _ORIGINALS:
            continue
        original = getattr(generation_utils, name, None)
        if original is None:
            raise ImportError(f"transformers.generation.utils has no {name}: this transformers version is not supported "
                              "by hf_jetspec (tested with 5.24)")
        _ORIGINALS[key] = original
        setattr(generation_utils, name, wrap(original))


def uninstall() -> None:
    """Restore transformers' originals."""
    for name, original in list(_ORIGINALS.items()):
        if name.startswith("utils."):
            setattr(generation_utils, name.removeprefix("utils."), original)
        else:
            setattr(GenerationMixin, name, original)
        del _ORIGINALS[name]


def is_installed() -> bool:
    return set(_ORIGINALS) == set(_WRAPPERS) | {f"utils.{name}" for name in _MODULE_WRAPPERS}
