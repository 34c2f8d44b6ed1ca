"""``DrafterFreeAssistant``: speculation for any target before a drafter exists.

No weights: each round proposes the continuation of the longest n-gram match in the sequence so far
(else in this assistant's earlier outputs), and the round policy decides how much of it to verify
from what verification costs on this target (a measured profile, vocabulary head included) and how
often proposals of that kind were accepted so far. Verification is the same exact match (greedy) or
point-mass rule (sampling) as every JetSpec round, so the output is the target's::

    assistant = DrafterFreeAssistant.for_target(target)
    out = target.generate(**inputs, assistant_model=assistant, max_new_tokens=256)
    assistant.generation_stats.tau  # committed tokens per verification forward

Keep one assistant per target and process: its output memory and acceptance counts carry from call
to call (and make later calls faster on recurring text).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..policy import OutputMemory
from .lm_source import LMSource, LMSourceConfig


@dataclass(frozen=True)
class DrafterFreeConfig:
    """Options of a :class:`DrafterFreeAssistant`.

    Args:
        budget: most positions one verification forward holds (the anchor plus ``budget - 1`` proposed tokens).
        max_ngram: longest suffix matched in the sequence so far.
        output_memory: also match in this assistant's earlier outputs.
        tree: verify a trie of the distinct n-gram continuations in one forward instead of the latest
            one's chain (:mod:`hf_jetspec.generation.ngram_tree`), on targets with a dynamic
            full-attention cache (sliding-window targets run chains). Off by default: against chains
            in one run it was +4.7% on SmolLM2 GSM8K, -3.1% HumanEval, -1.8% MT-Bench, +0.6% Qwen2.5-Coder
            HumanEval (docs/reports/2026-12-03-drafter-free-trees.md).
        tree_candidates: most distinct continuations a tree round holds.
        compiled_rounds: tree rounds on a static cache with the target's verification forward compiled
            per width bucket (:mod:`hf_jetspec.generation.static_rounds`); needs ``tree``.
        compile_backend: the ``torch.compile`` backend of compiled rounds (see ``DraftingConfig``).
        compile_buckets: the verify widths compiled (None: 1, 8, 16, ... up to ``budget``).
    """

    budget: int = 16
    max_ngram: int = 4
    output_memory: bool = True
    tree: bool = False
    tree_candidates: int = 4
    compiled_rounds: bool = False
    compile_backend: str = "inductor"
    compile_buckets: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.compiled_rounds and not self.tree:
            raise ValueError("compiled_rounds verifies through drafter-free tree rounds: set tree=True")
        if self.budget < 2:
            raise ValueError(f"budget must be >= 2 (the anchor and at least one proposed token), got {self.budget}")
        if self.max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {self.max_ngram}")
        if self.tree_candidates < 1:
            raise ValueError(f"tree_candidates must be >= 1, got {self.tree_candidates}")

    def replace(self, **changes) -> "DrafterFreeConfig":
        return replace(self, **changes)


class DrafterFreeAssistant:
    """An ``assistant_model`` for ``generate`` with no drafter: n-gram and output-memory proposals
    under the cost-aware round policy (see the module docstring).

    Args:
        target_config: the configuration of the target it serves (``generate`` compares vocabularies
            through it; :meth:`for_target` passes the model's own).
        config: a :class:`DrafterFreeConfig`.
        output_memory: the :class:`~hf_jetspec.policy.OutputMemory` shared by its calls (default: a new one).
    """

    def __init__(self, target_config, config: DrafterFreeConfig | None = None, output_memory: OutputMemory | None = None,
                 lm_source=None):
        if getattr(target_config, "is_encoder_decoder", False):
            raise ValueError("DrafterFreeAssistant serves decoder-only targets; this one is an encoder-decoder")
        self.config = target_config
        self.drafting_config = config if config is not None else DrafterFreeConfig()
        self.output_memory = output_memory if output_memory is not None else OutputMemory()
        self.generation_stats = None  # the statistics of the latest generate call
        self.lm_source = None
        self.attach_lm_source(lm_source)

    def attach_lm_source(self, lm_source, config: LMSourceConfig | None = None) -> LMSource | None:
        """Propose chains from a small causal LM beside the n-grams (:mod:`hf_jetspec.assistant.lm_source`):
        an :class:`~hf_jetspec.assistant.LMSource`, a causal LM with the target's tokenizer (wrapped
        with ``config``), or None to detach. Chain rounds only (``DrafterFreeConfig.tree`` refuses it)."""
        if lm_source is not None and not isinstance(lm_source, LMSource):
            lm_source = LMSource(lm_source, config)
        if lm_source is not None and self.drafting_config.tree:
            raise ValueError("DrafterFreeConfig(tree=True) verifies n-gram tries only; an LM source runs with chain rounds (tree=False)")
        self.lm_source = lm_source
        return lm_source

    @classmethod
    def for_target(cls, target, config: DrafterFreeConfig | None = None, **kwargs) -> "DrafterFreeAssistant":
        return cls(target.config, config, **kwargs)

    def check_target(self, target) -> None:
        """A clear error where ``target`` is not the model this assistant was built for (its output
        memory holds that model's token ids)."""
        mine, theirs = self.config.get_text_config(), target.config.get_text_config()
        if (mine.vocab_size, getattr(mine, "model_type", None)) != (theirs.vocab_size, getattr(theirs, "model_type", None)):
            raise ValueError(
                f"this DrafterFreeAssistant was built for a {getattr(mine, 'model_type', '?')} target with a "
                f"{mine.vocab_size}-token vocabulary, not this {getattr(theirs, 'model_type', '?')} one with "
                f"{theirs.vocab_size}: build one per target with DrafterFreeAssistant.for_target(target)"
            )
