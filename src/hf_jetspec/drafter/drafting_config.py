"""Inference-time drafting options, kept on the drafter as ``drafter.drafting_config``."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

DRAFTING_CONFIG_NAME = "drafting_config.json"
PIPELINES = ("auto", "thread", "off")


@dataclass
class DraftingConfig:
    """How a :class:`~hf_jetspec.JetSpecDrafter` drafts inside ``generate``.

    Attributes:
        budget: block size at verification: the anchor plus ``budget - 1`` draft tokens per
            round (the seed's "budget 16" verifies 16 positions). Independent of the training
            block size.
        num_jacobi_passes: Jacobi refinement passes J after the initial draft J0 (Eq. 8). Each
            pass re-runs the drafter with its own previous draft as the block inputs. Passes stop
            early once the draft is a fixed point (a further pass could not change it).
        seed: seed of the drafter's private random generator (noise tokens of J0). It never
            touches the global RNG, so the target's sampling stream is unaffected.
        foresight: pre-draft the next block for the most likely verification outcomes while the
            current block is verified (needs a foresight adapter: ``drafter.attach_foresight``).
            On a hit the pre-drafted block is proposed as is; on a miss the fallback is a J0 draft
            from the verified context (seed 000, Section 4.1).
        cache_size: outcomes pre-drafted per round (B).
        num_context_refreshes: context refreshes R <= J per round: the adapter re-predicts the
            target states of the current draft and the decoder re-scores it before a pass.
        anchor_replacement: after a refresh, fix the draft up to the first position where the
            decoder's top token differs and write the decoder's token there.
        pipeline: where foresight work runs: ``"auto"`` (a background CUDA stream on GPU, in line on
            CPU, where a worker thread competes with verification for the same cores),
            ``"thread"``, or ``"off"`` (in line, before the block is verified).
        conformal: cache only outcomes above the calibrated conformal threshold (up to
            ``cache_size``) instead of always ``cache_size``.
        record_rounds: keep per-round foresight records (decoder scores, features, realised
            outcome) in ``generation_stats.foresight_records`` for calibration and replay.
        policy: choose each round what to verify (:mod:`hf_jetspec.policy`): a plain target step,
            the n-gram proposal or the drafter's block, truncated to the length ``L <= budget - 1``
            with the most expected committed tokens per second under the measured cost model; the
            drafter runs only when it is expected to pay for itself. With ``policy=False`` every
            round verifies a full ``budget``-token drafter block. Foresight rounds
            (``foresight`` / ``num_context_refreshes``) always use full blocks.
        ngram: with the policy, also propose n-gram continuations: the longest earlier match of
            the sequence's suffix (up to ``max_ngram`` tokens), else a match in earlier outputs of
            this process (``output_memory``).
        ngram_seed: with the policy, an n-gram continuation seeds the drafter's block instead of
            noise, and the Jacobi passes refine it.
        max_ngram: longest suffix matched by the n-gram source.
        output_memory: keep this process's earlier sequences in ``drafter.output_memory`` and
            propose from them.
        record_acceptance: record per-round acceptance features in
            ``generation_stats.acceptance_records`` (for ``hf-jetspec calibrate-policy``); the
            drafter then drafts and verifies a full block every round.
        compile: draft single blocks through a ``torch.compile``d step with static shapes
            (:mod:`hf_jetspec.drafter.compiled_step`); the first round of each block length compiles.
            Off by default: see ``benchmarks/round_cost.py`` (``@compile`` trees) for what it costs and saves.
        compiled_rounds: run every round on a static cache with the target's verification forward
            compiled once per width bucket, and the drafter's step compiled (``compile``)
            (:mod:`hf_jetspec.generation.static_rounds`). Rounds go through the tree loop whatever the
            temperature or prompt length (a chain is a one-branch tree), so ``tree`` must be set and
            no chain-only feature asked for. The first call on a target compiles and times each bucket
            (its warm-up is in ``generation_stats.prefill_time_s``); later calls compile nothing.
            Targets with sliding-window layers get an error. The output is what plain decoding writes
            with the same compiled kernels (greedy; under sampling, the target's distribution).
        compile_backend: the ``torch.compile`` backend of compiled rounds (``"inductor"``: frozen weights
            on CPU, CUDA graphs on CUDA; ``"eager"`` / ``"aot_eager"`` trace without generating code).
        compile_buckets: the verify widths compiled rounds compile (None: 1, 8, 16, ... up to the
            widest round); a round runs in the cheapest measured bucket that holds it.
        int8: multiply the drafter's layer matrices and draft head in int8 (CPU only,
            :mod:`hf_jetspec.drafter.int8_drafting`): per-channel weights, activations quantised per row at
            every call. Drafts may differ slightly from floating-point drafting; the output does not
            (verification is exact). It pays with ``compile`` (the quantisation fuses there); eagerly
            it costs about what it saves. Measured in docs/reports/2026-11-30-drafting-engine-ms-per-round.md.
        tree: verify a token tree instead of a chain (:mod:`hf_jetspec.generation.tree_decoding`): None (off,
            chains), ``"auto"`` (the ``budget - 1`` nodes of highest cumulative draft probability,
            EAGLE-2 style) or a list of widths per depth (the top-1 chain with ``w - 1`` alternative
            siblings at each depth; ``sum(widths) <= budget - 1`` nodes). Tree rounds run their own
            verification loop. With ``policy`` and ``"auto"`` the drafter runs only when it is expected to pay,
            the n-gram continuation is grafted into the tree as a branch of its own, and the node
            count is the prefix of the best-first tree (nodes ranked by the calibrated estimate that
            their path is accepted) with the most expected tokens per second; without it (or with a
            static shape) every round verifies the full tree. Foresight, context refreshes and
            ``record_acceptance`` run in chain rounds: asking for them runs chains, with one log line.
        tree_nodes: the most nodes a tree round of the round policy may verify (None: ``budget - 1``).
            Depth stays at most ``budget - 1``; the node count actually verified is still the one
            with the most expected tokens per second under the measured costs, which are profiled
            up to ``tree_nodes + 1`` tokens, so a larger value only lets wider trees compete.
        tree_max_temperature: under sampling, tree rounds run only up to this temperature and
            chains above it (None: trees at every temperature). Sampled trees draw each node from
            ``q``; where ``q`` alone carries long runs, the chain's cheaper round wins (the shipped
            Qwen2.5-Coder-1.5B drafter sets 0.5: trees 3.21x against chains 2.85x at T = 0.2,
            2.58x against 2.92x at T = 0.7; docs/reports/2026-12-01-sampling-drafts-from-q.md).
        tree_max_context: tree rounds run only for prompts of up to this many tokens, chains for
            longer ones (None: trees at every length). A tree's nodes each attend over the whole
            cache, so its verification grows with the context faster than a chain's
            (docs/reports/2026-12-02-long-prompts-with-tree-rounds.md).
        tree_top_k: candidates per position a tree may branch into (``"auto"``). 8 gave a higher tau than
            2, 3, 4 and 6 at budget 8 and than 4 at budget 16 (docs/reports/2026-11-30-tree-verification-against-chains.md).
        tree_jacobi_passes: Jacobi passes in tree rounds (None: ``num_jacobi_passes``). Depth-1
            candidates do not depend on them; deeper ones do. Where a drafter pass is a large share
            of a target step one pass can be better: the shipped SmolLM2 drafter sets 0 (faster in
            four SmolLM2 runs), the Qwen2.5-Coder-1.5B one keeps 1 (faster there); see
            docs/reports/2026-11-30-tree-verification-against-chains.md.
        batch_trees: in batched ``generate`` (several left-padded rows) under greedy decoding, verify
            a best-first token tree per row (the drafter's top-``tree_top_k`` candidates with the
            row's n-gram continuation grafted in, priced by the same calibration as one-row trees)
            instead of a chain per row. Off by default (see docs/round-policy.md, "Several prompts at
            once", for what it measured).
        tree_branches: with ``tree="auto"``, re-draft what follows the first ``tree_branches``
            depth-1 alternatives in one batched drafter pass, so that their subtrees hold the
            drafter's predictions after those tokens rather than after the top-1 one (0: off).
        context_window: the drafter reads at most the last ``context_window`` verified positions
            (None: all of them). Its cache keeps those rows only, and a drafter run after plain
            steps projects only the newest ``context_window`` of the rows it has not seen, so a
            drafter pass and its cache fill stop growing with the prompt. Proposals change, the
            output does not (verification is exact). Foresight rounds read the whole context
            (their adapter and decoder index it by position), so with ``foresight`` or
            ``num_context_refreshes`` the window is not applied. Not with a drafter whose own config
            sets ``sliding_window``.
        sampled_drafts: under sampling (``do_sample=True``), draw each drafter token from the
            drafter's own distribution ``q`` (the final Jacobi pass, shaped by the target's logits
            processors) and verify with ``min(1, p/q)`` and the residual; tree rounds draw each
            node's children from ``q`` and verify them by multi-draft rejection
            (:mod:`hf_jetspec.generation.sampled_drafting`). False: argmax drafts and top-k trees, point masses
            verified with exact match's law (chain rounds hand them over as point-mass logits). Both are
            exact; greedy decoding is unaffected.
        proposal_sharpness: under sampling with ``sampled_drafts``, the drafter's logits are
            multiplied by this before the target's processors shape them into ``q`` (1: the
            drafter's own distribution; larger: sharper). Any value is exact; the best one depends
            on how well the drafter's confidence matches the target's, measured per drafter by
            ``benchmarks/proposal_shape.py``.
        sampled_drafts_min_temperature: draw drafts from ``q`` only when the sampling temperature
            is at least this (below it, argmax drafts): where the drafter's ``q`` gains little over
            its argmax, the argmax is cheaper to draft (the shipped SmolLM2 drafter sets 0.85;
            docs/reports/2026-12-01-sampling-drafts-from-q.md).
    """

    budget: int = 16
    num_jacobi_passes: int = 1
    seed: int = 0
    foresight: bool = False
    cache_size: int = 4
    num_context_refreshes: int = 0
    anchor_replacement: bool = True
    pipeline: str = "auto"
    conformal: bool = False
    record_rounds: bool = False
    policy: bool = True
    ngram: bool = True
    ngram_seed: bool = True
    max_ngram: int = 4
    output_memory: bool = True
    record_acceptance: bool = False
    compile: bool = False
    compiled_rounds: bool = False
    compile_backend: str = "inductor"
    compile_buckets: tuple[int, ...] | None = None
    int8: bool = False
    tree: str | list[int] | None = None
    tree_top_k: int = 8
    tree_nodes: int | None = None
    tree_branches: int = 0
    batch_trees: bool = False
    tree_jacobi_passes: int | None = None
    tree_max_temperature: float | None = None
    tree_max_context: int | None = None
    context_window: int | None = None
    sampled_drafts: bool = True
    proposal_sharpness: float = 1.0
    sampled_drafts_min_temperature: float = 0.0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if self.compile_buckets is not None:
            self.compile_buckets = tuple(int(b) for b in self.compile_buckets)
            if not self.compile_buckets or min(self.compile_buckets) < 1:
                raise ValueError(f"compile_buckets must be positive widths, got {self.compile_buckets!r}")
        if self.compiled_rounds:
            if self.tree is None:
                raise ValueError("compiled_rounds verifies through tree rounds: set tree='auto' (chains are one-branch trees there)")
            if self.tree_fallback_reason is not None:
                raise ValueError(f"compiled_rounds runs tree rounds only; {self.tree_fallback_reason}: turn them off")
        if not isinstance(self.budget, int) or self.budget < 2:
            raise ValueError(f"budget must be an int >= 2 (anchor + at least one draft token), got {self.budget!r}")
        if not isinstance(self.num_jacobi_passes, int) or self.num_jacobi_passes < 0:
            raise ValueError(f"num_jacobi_passes must be an int >= 0, got {self.num_jacobi_passes!r}")
        if not isinstance(self.cache_size, int) or self.cache_size < 1:
            raise ValueError(f"cache_size must be an int >= 1, got {self.cache_size!r}")
        if self.tree_jacobi_passes is not None and (not isinstance(self.tree_jacobi_passes, int) or self.tree_jacobi_passes < 0):
            raise ValueError(f"tree_jacobi_passes must be None or an int >= 0, got {self.tree_jacobi_passes!r}")
        if not isinstance(self.num_context_refreshes, int) or not 0 <= self.num_context_refreshes <= self.num_jacobi_passes:
            raise ValueError(
                f"num_context_refreshes must be an int in 0..num_jacobi_passes ({self.num_jacobi_passes}): a refresh "
                f"runs between two passes; got {self.num_context_refreshes!r}"
            )
        if not isinstance(self.max_ngram, int) or self.max_ngram < 1:
            raise ValueError(f"max_ngram must be an int >= 1, got {self.max_ngram!r}")
        if isinstance(self.proposal_sharpness, bool) or not isinstance(self.proposal_sharpness, (int, float)) or not (
                0 < self.proposal_sharpness < float("inf")):
            raise ValueError(f"proposal_sharpness must be a finite number > 0, got {self.proposal_sharpness!r}")
        if isinstance(self.sampled_drafts_min_temperature, bool) or not isinstance(self.sampled_drafts_min_temperature, (int, float)) \
                or not self.sampled_drafts_min_temperature >= 0:
            raise ValueError(f"sampled_drafts_min_temperature must be a number >= 0, got {self.sampled_drafts_min_temperature!r}")

        if isinstance(self.tree, tuple):
            self.tree = list(self.tree)
        if self.tree == "off":
            self.tree = None
        if self.tree is not None and self.tree != "auto":
            if not isinstance(self.tree, list) or not self.tree or not all(isinstance(w, int) and w >= 1 for w in self.tree):
                raise ValueError(f"tree must be None, 'auto' or a list of widths >= 1 per depth, got {self.tree!r}")
            if sum(self.tree) > self.budget - 1:
                raise ValueError(f"tree widths {self.tree} make {sum(self.tree)} nodes, more than budget - 1 = {self.budget - 1}")
        if self.tree_max_temperature is not None and (isinstance(self.tree_max_temperature, bool) or not isinstance(
                self.tree_max_temperature, (int, float)) or not self.tree_max_temperature >= 0):
            raise ValueError(f"tree_max_temperature must be None or a number >= 0, got {self.tree_max_temperature!r}")
        if self.tree_max_context is not None and (isinstance(self.tree_max_context, bool) or not isinstance(self.tree_max_context, int)
                                                  or self.tree_max_context < 1):
            raise ValueError(f"tree_max_context must be None or an int >= 1, got {self.tree_max_context!r}")
        if not isinstance(self.tree_top_k, int) or self.tree_top_k < 1:
            raise ValueError(f"tree_top_k must be an int >= 1, got {self.tree_top_k!r}")
        if self.tree_nodes is not None and (isinstance(self.tree_nodes, bool) or not isinstance(self.tree_nodes, int) or self.tree_nodes < 1):
            raise ValueError(f"tree_nodes must be None or an int >= 1, got {self.tree_nodes!r}")
        if not isinstance(self.batch_trees, bool):
            raise ValueError(f"batch_trees must be True or False, got {self.batch_trees!r}")
        if not isinstance(self.tree_branches, int) or not 0 <= self.tree_branches < self.tree_top_k:
            raise ValueError(f"tree_branches must be an int in 0..tree_top_k - 1 ({self.tree_top_k - 1}), got {self.tree_branches!r}")
        if self.context_window is not None:
            if not isinstance(self.context_window, int) or isinstance(self.context_window, bool) or self.context_window < 1:
                raise ValueError(f"context_window must be None or an int >= 1 (verified positions the drafter reads), got {self.context_window!r}")
        for name in ("compile", "int8"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.pipeline not in PIPELINES:
            raise ValueError(f"pipeline must be one of {PIPELINES}, got {self.pipeline!r}")

    def draws_from_q(self, generation_config) -> bool:
        """Whether a ``generate`` call with ``generation_config`` draws its drafts from ``q``: sampling,
        ``sampled_drafts`` on, at a temperature of at least ``sampled_drafts_min_temperature``."""
        if not generation_config.do_sample or not self.sampled_drafts:
            return False
        temperature = generation_config.temperature if generation_config.temperature is not None else 1.0
        return temperature >= self.sampled_drafts_min_temperature

    @property
    def needs_foresight_models(self) -> bool:
        return self.foresight or self.num_context_refreshes > 0

    @property
    def tree_fallback_reason(self) -> str | None:
        """Why rounds run as chains although ``tree`` is set (None when trees run, or are off): foresight,
        context refreshes and acceptance recording are chain-round features, and asking for them wins."""
        if self.tree is None:
            return None
        asked = [name for name, on in (("foresight", self.foresight), ("num_context_refreshes", self.num_context_refreshes > 0),
                                       ("record_acceptance", self.record_acceptance)) if on]
        return None if not asked else f"{' and '.join(asked)} run in chain rounds only"

    @property
    def runs_tree_rounds(self) -> bool:
        return self.tree is not None and self.tree_fallback_reason is None

    def tree_rounds_for(self, generation_config, context_length: int | None = None) -> bool:
        """Whether a ``generate`` call with ``generation_config`` and a prompt of ``context_length``
        tokens runs tree rounds: ``tree`` set, no chain-only feature asked for, the prompt within
        ``tree_max_context`` and (when sampling) a temperature up to ``tree_max_temperature``."""
        if not self.runs_tree_rounds:
            return False
        if self.compiled_rounds:  # every round goes through the compiled tree loop
            return True
        if self.tree_max_context is not None and context_length is not None and context_length > self.tree_max_context:
            return False
        if generation_config is None or not generation_config.do_sample or self.tree_max_temperature is None:
            return True
        temperature = generation_config.temperature if generation_config.temperature is not None else 1.0
        return temperature <= self.tree_max_temperature

    @property
    def effective_context_window(self) -> int | None:
        """``context_window`` where it applies (not in foresight rounds, which read the whole context)."""
        return None if self.needs_foresight_models else self.context_window

    @property
    def max_verify_width(self) -> int:
        """The most tokens one tree round verifies: the anchor and its widest tree."""
        return 1 + max(self.budget - 1, self.tree_node_budget)

    @property
    def tree_node_budget(self) -> int:
        """The most nodes a policy tree round may verify: ``tree_nodes``, else ``budget - 1``."""
        return self.budget - 1 if self.tree_nodes is None else self.tree_nodes

    @property
    def tree_passes(self) -> int:
        """Jacobi passes a tree round runs: ``tree_jacobi_passes``, else ``num_jacobi_passes``."""
        return self.num_jacobi_passes if self.tree_jacobi_passes is None else self.tree_jacobi_passes

    @property
    def uses_policy(self) -> bool:
        """Whether rounds go through the round policy (on, and no foresight models in use)."""
        return (self.policy or self.record_acceptance) and not self.needs_foresight_models

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def replace(self, **changes) -> "DraftingConfig":
        unknown = set(changes) - self.field_names()
        if unknown:
            raise TypeError(f"unknown drafting option(s) {sorted(unknown)}; known: {sorted(self.field_names())}")
        return dataclasses.replace(self, **changes)

    def save(self, directory: str | os.PathLike) -> None:
        with open(os.path.join(directory, DRAFTING_CONFIG_NAME), "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "DraftingConfig":
        path = os.path.join(directory, DRAFTING_CONFIG_NAME)
        if not os.path.isfile(path):
            return cls()
        with open(path) as f:
            data = json.load(f)
        known = cls.field_names()
        return cls(**{k: v for k, v in data.items() if k in known})


def check_context_window(drafter, options) -> None:
    """``context_window`` moves cache rows away from their position's index, which a drafter with its
    own sliding-window mask (row t = position t) cannot take."""
    if options.effective_context_window is not None and drafter.config.sliding_window is not None:
        raise ValueError(f"this drafter already reads a sliding window of {drafter.config.sliding_window} positions "
                         "(config.sliding_window): leave drafting_config.context_window at None")
