"""Side-by-side speed benchmark of decoding methods on one target (``hf-jetspec bench``).

All methods run in one process on the same prompts, interleaved prompt by prompt (the method
order rotates from prompt to prompt) so that machine drift hits every method alike, after a
warm-up. Metrics are computed with the package's ``evaluate`` modules.

Methods:
    ar              the target's own ``generate`` (greedy or sampled)
    ar-static       plain greedy steps through the forward compiled rounds verify with (``static_greedy``:
                    frozen weights on CPU, each step in the cheapest measured bucket): what compilation
                    alone gives plain decoding here (greedy only; no ``generate`` options)
    ar-compiled     the same on a static cache with the compiled forward (``cache_implementation="static"``
                    and a ``CompileConfig``: inductor, with CUDA graphs on CUDA); the
                    cache is sized for the longest item, and the compile (a warm-up on that item) is
                    reported as ``compile_warmup_s``, not timed
    prompt-lookup   transformers' prompt lookup decoding (``prompt_lookup_num_tokens``)
    drafter-free    ``generate(assistant_model=DrafterFreeAssistant)``: n-gram and output-memory proposals
                    under the round policy, no drafter weights (its own output memory; ``--budget`` applies;
                    ``--tree auto`` gives it tree rounds of the distinct continuations)
    drafter-free-tree   the same with tree rounds, whatever ``--tree`` says
    jetspec         ``generate(assistant_model=JetSpecDrafter)`` (round policy per ``--policy``, on by default)
    jetspec-fixed   the same drafter, policy off: a full ``budget``-token block every round
    jetspec-length  policy with verify-length selection only (no n-gram proposals or seeding)
    jetspec-ngram   policy with n-gram proposals, drafter blocks not seeded by them
    jetspec-j0/j1/j2  the round policy with 0, 1 or 2 Jacobi passes (whatever ``--jacobi-passes`` says)
    jetspec-tree    tree verification: the ``budget - 1`` best-first nodes of the drafter's top-k every round
    jetspec-tree-branched  the same, with what follows the 3 best depth-1 alternatives re-drafted in one batch
    jetspec-tree-policy    tree rounds under the round policy: drafting gated, the n-gram continuation grafted
                    in as a branch, the node count (0: a plain step) chosen from the cost model
    jetspec-tree-branched-policy  the same with the 3 re-drafted branches
    jetspec-tree-policy-j0/j1  tree rounds under the round policy with one drafter pass (no Jacobi
                    pass) / with one Jacobi pass, whatever the drafter's ``tree_jacobi_passes`` says
    jetspec-baseline  ``jetspec`` with another drafter (``--baseline-drafter``, e.g. the one a new drafter
                    replaces), its own drafting options and calibration, so two drafters meet in one run
    jetspec-compiled  ``jetspec`` with compiled rounds (``compiled_rounds=True``): the target's verification
                    forward compiled per width bucket on a static cache, the drafter's step compiled
                    (:mod:`hf_jetspec.generation.static_rounds`); warm-up reported as ``compile_warmup_s``
    jetspec-compiled-drafter  ``jetspec`` drafting through the compiled step alone (``compile=True``)
    jetspec-int8    ``jetspec`` drafting through the compiled step in int8 arithmetic (``compile=True, int8=True``)
    jetspec-online  ``jetspec`` with its own copy of the drafter learning online after every item
                    (:mod:`hf_jetspec.training.online`; ``--learn-steps`` / ``--learn-share``), learning time
                    counted in its wall time; its tau per item and over the second half are reported
    assisted        transformers' classic assistant model (the 0.5B model for Qwen2.5-Coder-1.5B)
    hf-dflash       transformers' own DFlash generation (``speculation_type="dflash"``) with the same
                    drafter's weights converted to ``MuseGlimmerAssistantModel`` (a DFlash-layout drafter)
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..data import prompt_input_ids
from ..generation.stats import GenerationStats
from ..assistant import assistant_for
from .environment import describe_environment

JETSPEC_VARIANTS = {
    # name: drafting-config changes on top of the bench's jetspec options
    "jetspec": {},  # the drafter's shipped defaults (tree rounds under the policy for the shipped drafters)
    "jetspec-chain": {"tree": None},  # the same with chain rounds
    "jetspec-fixed": {"policy": False},  # every round verifies a full budget-token drafter block
    "jetspec-length": {"policy": True, "ngram": False, "ngram_seed": False},  # verify-length selection only
    "jetspec-ngram": {"policy": True, "ngram": True, "ngram_seed": False},  # + n-gram proposals
    "jetspec-j0": {"policy": True, "num_jacobi_passes": 0},
    "jetspec-j1": {"policy": True, "num_jacobi_passes": 1},
    "jetspec-j2": {"policy": True, "num_jacobi_passes": 2},
    "jetspec-tree": {"tree": "auto", "policy": False},  # a best-first tree of budget - 1 nodes every round (its own loop)
    "jetspec-tree-branched": {"tree": "auto", "tree_branches": 3, "policy": False},  # + the depth-1 alternatives' continuations re-drafted
    "jetspec-tree-policy": {"tree": "auto", "policy": True},  # the round policy: n-gram branch grafted, node count from the cost model
    "jetspec-tree-branched-policy": {"tree": "auto", "tree_branches": 3, "policy": True},
    "jetspec-tree-policy-j0": {"tree": "auto", "policy": True, "tree_jacobi_passes": 0},  # a tree reads its top-k off one pass
    "jetspec-tree-policy-j1": {"tree": "auto", "policy": True, "tree_jacobi_passes": 1},
    "jetspec-pointmass": {"sampled_drafts": False},  # under sampling: argmax drafts (point masses), exact-match verification
    "jetspec-tree-policy-pointmass": {"tree": "auto", "policy": True, "sampled_drafts": False},  # top-k trees of point masses
    "jetspec-baseline": {},  # the bench's jetspec options on the --baseline-drafter
    "jetspec-compiled": {"compiled_rounds": True, "tree": "auto"},  # compiled verification on a static cache + the compiled drafting step
    "jetspec-compiled-drafter": {"compile": True},  # drafting through the compiled static-shape step alone
    "jetspec-int8": {"compile": True, "int8": True},  # the compiled step with int8 products
    "jetspec-online": {},  # the bench's jetspec options on its own drafter copy, learning after every item
    "jetspec-lm": {},  # the bench's jetspec options with the --lm-source model proposing chains beside the drafter
    "jetspec-wide": {"tree_nodes": 32},  # policy trees may verify up to 32 nodes (the cost model still picks the count)
    "jetspec-batch-tree": {"batch_trees": True},  # with --batch-size > 1: a token tree per row (greedy), else as jetspec
}
DRAFTER_FREE_VARIANTS = ("drafter-free", "drafter-free-tree")
PLAIN_METHODS = ("ar", "ar-compiled", "ar-static")  # the target alone: no rounds, no tau
METHODS = ("ar", "ar-compiled", "ar-static", "prompt-lookup", *DRAFTER_FREE_VARIANTS, *JETSPEC_VARIANTS, "assisted", "hf-dflash")
# what runs on several rows at once; the rest say why not in the result (``unavailable``)
BATCH_METHODS = ("ar", "drafter-free", "jetspec", "jetspec-chain", "jetspec-batch-tree")
BATCH_UNAVAILABLE = {
    "prompt-lookup": "transformers' prompt lookup refuses more than one row (assisted generate is only supported for batch_size = 1)",
    "assisted": "transformers' assisted generation refuses more than one row",
    "hf-dflash": "transformers' DFlash generation runs one row at a time",
    "ar-compiled": "the static-cache compiled path is measured one row at a time here",
    "ar-static": "static_greedy decodes one row",
    "drafter-free-tree": "batched rounds verify chains (trees run one row at a time)",
}
BATCH_JETSPEC_UNAVAILABLE = "batched rounds run the drafter's chains with the round policy; this variant's features run one row at a time"
DEFAULT_ASSISTANTS = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}


@dataclass
class BenchConfig:
    """What ``hf-jetspec bench`` runs."""

    target: str = "smollm2-135m"
    prompts: str = "gsm8k"
    limit: int | None = 20
    offset: int = 0
    max_new_tokens: int = 256
    methods: tuple[str, ...] = ("ar", "prompt-lookup", "jetspec")
    drafter: str | None = None
    assistant: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0  # with temperature > 0: nucleus sampling for every method
    jacobi_passes: int | None = None
    budget: int | None = None
    prompt_lookup_tokens: int = 10
    foresight: bool | None = None
    cache_size: int | None = None
    context_refreshes: int | None = None
    pipeline: str | None = None
    adapter: str | None = None
    warmup_tokens: int = 32
    seed: int = 0
    output: str | None = None
    dtype: str = "auto"
    policy: bool = True
    tie_margin_items: int = 4
    fp32_head: bool = False
    tree: str | None = None  # drafting_config.tree of every jetspec method ("auto", "off"; None: the drafter's own)
    tree_top_k: int | None = None  # drafting_config.tree_top_k: candidates per depth a tree may branch into
    baseline_drafter: str | None = None  # the drafter of the jetspec-baseline method
    learn_steps: int = 4  # jetspec-online: optimizer steps after each item
    learn_share: float | None = None  # jetspec-online: instead, learning time as this share of its generation time
    learn_lr: float = 1e-4  # jetspec-online: learning rate
    batch_size: int = 1  # prompts per generate call, grouped in file order and left-padded (methods: BATCH_METHODS)
    lm_source: str | None = None  # jetspec-lm: the small LM (an embedded name or a path); default: the target's default assistant
    lm_int8: bool | None = None  # jetspec-lm: LMSourceConfig.int8 (None: on the CPU)
    lm_head_vocab: int | None = None  # jetspec-lm: LMSourceConfig.head_vocab (None: the whole head)
    compile_backend: str = "inductor"  # ar-compiled and jetspec-compiled: the torch.compile backend ("eager" traces only)

    def __post_init__(self):
        self.methods = tuple(self.methods)
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {METHODS}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if "ar-static" in self.methods and self.temperature > 0:
            raise ValueError("ar-static decodes greedily: run it with temperature 0 (ar-compiled samples)")
        if ("jetspec-baseline" in self.methods) != (self.baseline_drafter is not None):
            raise ValueError("the jetspec-baseline method and --baseline-drafter go together: give both or neither")


@dataclass
class MethodRecord:
    """Per-method measurements accumulated over prompts."""

    name: str
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    first_chunk_s: list[float] = field(default_factory=list)  # time to the first delivered chunk (prefill + first step)
    first_chunk_tokens: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    accepted: list[list[int]] = field(default_factory=list)
    peak_memory_mb: float = 0.0
    stats: GenerationStats | None = None  # JetSpec methods: the drafter's statistics, merged over prompts
    learn_seconds: list[float] = field(default_factory=list)  # jetspec-online: learning time inside each item's call


class RoundCounter:
    """A generate streamer that records how many tokens each ``put`` delivers.

    transformers puts the prompt first, then one chunk per decoding step: per token for plain
    decoding, per verification round (accepted tokens + bonus) for assisted decoding. The clock time
    of the first chunk (``first_at``) splits a generation into its prefill (the prompt's forward,
    which every method pays alike) and its decoding.
    """

    def __init__(self):
        self.chunks: list[int] = []
        self._prompt_seen = False
        self.first_at: float | None = None

    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if self.first_at is None:
            self.first_at = time.perf_counter()
        self.chunks.append(int(value.numel()))

    def end(self):
        pass


class PeakMemory:
    """Extra memory a block of code needs: peak over start, CUDA allocator or process RSS (sampled)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_mb = 0.0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            return self
        import psutil

        self._proc = psutil.Process()
        self._base = self._proc.memory_info().rss
        self._peak = self._base
        self._stop = threading.Event()

        def watch():
            while not self._stop.is_set():
                self._peak = max(self._peak, self._proc.memory_info().rss)
                self._stop.wait(0.005)

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self._base) / 2**20
        else:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, self._proc.memory_info().rss)
            self.peak_mb = (self._peak - self._base) / 2**20
        return False


def build_items(tokenizer, target, prompts, max_new_tokens: int) -> list[tuple[str, torch.Tensor]]:
    """(id, input_ids) per benchmark item. A multi-turn prompt (MT-Bench) yields one item per turn;
    turn t is conditioned on the target's own greedy answers to the earlier turns."""
    items = []
    limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    for p in prompts:
        messages = []
        for t, turn in enumerate(p.turns):
            messages.append({"role": "user", "content": turn})
            ids = prompt_input_ids(tokenizer, p, messages)
            if limit is not None and ids.shape[1] + max_new_tokens > limit:
                raise ValueError(f"{p.id}: a {ids.shape[1]}-token prompt and {max_new_tokens} new tokens exceed the target's "
                                 f"{limit}-position context: lower --max-new-tokens")
            items.append((p.id if len(p.turns) == 1 else f"{p.id}-turn{t + 1}", ids))
            if t + 1 < len(p.turns):
                with torch.no_grad():
                    out = target.generate(ids.to(target.device), attention_mask=torch.ones_like(ids).to(target.device), do_sample=False, max_new_tokens=max_new_tokens)
                answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
                messages.append({"role": "assistant", "content": answer})
    return items


@dataclass
class BenchSetup:
    """Everything ``run_bench`` loaded: models, items, generation kwargs and per-method extras."""

    target: object
    tokenizer: object
    items: list
    gen_kwargs: dict
    extra: dict
    drafter: object = None
    assistant: object = None
    dflash_assistant: object = None  # hf-dflash: the drafter's weights as a MuseGlimmerAssistantModel
    baseline: object = None  # jetspec-baseline: the other drafter
    drafter_free: dict = field(default_factory=dict)  # drafter-free variant -> its DrafterFreeAssistant
    online_config: object = None  # jetspec-online: its OnlineLearningConfig
    online: object = None  # jetspec-online: its own drafter, with an online learner
    memories: dict = field(default_factory=dict)
    lm_source: object = None  # jetspec-lm: its LMSource
    static_capacity: int = 0  # ar-compiled: the static cache's positions (the longest item's need, rounded up)


def load_bench(config: BenchConfig) -> BenchSetup:
    """Load the target (in ``config.dtype``), the drafter / assistant the methods need, and the items."""
    from ..data import load_eval_prompts
    from .targets import load_drafter_for, load_target

    torch.manual_seed(config.seed)
    target, tokenizer = load_target(config.target, dtype=config.dtype)
    if config.fp32_head:
        from .numerics import upcast_head

        upcast_head(target)
    device = target.device
    prompts = load_eval_prompts(config.prompts, limit=config.limit, seed=config.seed, offset=config.offset, tokenizer=tokenizer)
    extra: dict = {}
    drafter = assistant = dflash = baseline = None
    variants = [m for m in config.methods if m in JETSPEC_VARIANTS]
    if variants or "hf-dflash" in config.methods:
        drafter, what = load_drafter_for(target, config.target, config.drafter)
        changes = {
            "budget": config.budget,
            "num_jacobi_passes": config.jacobi_passes,
            "foresight": config.foresight,
            "cache_size": config.cache_size,
            "num_context_refreshes": config.context_refreshes,
            "pipeline": config.pipeline,
            "policy": config.policy,
            "tree": config.tree,
            "tree_top_k": config.tree_top_k,
        }
        changes = {k: v for k, v in changes.items() if v is not None}
        drafter.drafting_config = drafter.drafting_config.replace(**changes)
        if config.baseline_drafter is not None:
            baseline, baseline_what = load_drafter_for(target, config.target, config.baseline_drafter)
            baseline.drafting_config = baseline.drafting_config.replace(**changes)
        if "jetspec-online" in variants:  # its own copy: the frozen drafter never sees an update
            online, _ = load_drafter_for(target, config.target, config.drafter)
            online.drafting_config = online.drafting_config.replace(**changes)
        for name in variants:
            mine, mine_what = (baseline, baseline_what) if name == "jetspec-baseline" else (drafter, what)
            options = mine.drafting_config.replace(**JETSPEC_VARIANTS[name])
            if options.compiled_rounds:
                options = options.replace(compile_backend=config.compile_backend)
            extra[name] = {
                "drafter": mine_what,
                "drafting_config": asdict(options),
                "drafter_params_mb": _param_mb(mine),
                "acceptance_calibrated": assistant_for(mine).acceptance_model.calibrated,
            }
        if drafter.drafting_config.needs_foresight_models:
            from .targets import companion_adapter_path

            adapter = config.adapter or companion_adapter_path(config.target)
            if adapter is None:
                raise ValueError(f"foresight / context refresh need a foresight adapter: pass --adapter (none is shipped for {config.target!r})")
            if baseline is not None:
                raise ValueError("jetspec-baseline compares plain drafters: foresight options are not supported with it")
            assistant_for(drafter).attach_foresight(str(adapter))
            for name in variants:
                extra[name]["adapter"] = str(config.adapter or Path(adapter).relative_to(Path(adapter).parents[1]))
                extra[name]["calibrated"] = assistant_for(drafter).foresight[1] is not None
    if "assisted" in config.methods:
        name = config.assistant or config.lm_source or DEFAULT_ASSISTANTS.get(config.target)
        if name is None:
            raise ValueError(f"no default assistant model for {config.target!r}: pass --assistant")
        assistant, _ = load_target(name, device=device, dtype=target.dtype)
        extra["assisted"] = {"assistant": name, "assistant_params_mb": _param_mb(assistant)}
    lm_source = None
    if "jetspec-lm" in config.methods:
        from ..assistant import LMSource, LMSourceConfig

        name = config.lm_source or DEFAULT_ASSISTANTS.get(config.target)
        if name is None:
            raise ValueError(f"jetspec-lm needs a small LM with the target's tokenizer: pass --lm-source (none is known for {config.target!r})")
        lm, lm_tokenizer = load_target(name, device=device, dtype=target.dtype)
        lm_config = LMSourceConfig(int8=config.lm_int8, head_vocab=config.lm_head_vocab)
        lm_source = LMSource.for_target(target, lm, lm_config, preferred_ids=drafter.draft_vocab_ids, target_tokenizer=tokenizer,
                                        lm_tokenizer=lm_tokenizer)
        extra["jetspec-lm"] |= {"lm_source": name, "lm_source_config": asdict(lm_source.config), "lm_params_mb": _param_mb(lm)}
    if "prompt-lookup" in config.methods:
        extra["prompt-lookup"] = {"prompt_lookup_num_tokens": config.prompt_lookup_tokens}
    drafter_free = {}
    for name in (m for m in DRAFTER_FREE_VARIANTS if m in config.methods):
        from ..assistant import DrafterFreeAssistant, DrafterFreeConfig

        free_config = DrafterFreeConfig(tree=name == "drafter-free-tree" or config.tree not in (None, "off"))
        if config.budget is not None:
            free_config = free_config.replace(budget=config.budget)
        drafter_free[name] = DrafterFreeAssistant.for_target(target, free_config)
        extra[name] = {"drafting_config": asdict(free_config)}
    if "hf-dflash" in config.methods:
        from ..drafter.dflash_format import muse_glimmer_assistant

        dflash = muse_glimmer_assistant(drafter)  # raises, naming the fields, for a drafter without the DFlash layout
        extra["hf-dflash"] = {"drafter": what, "block_size": dflash.config.block_size, "assistant": "MuseGlimmerAssistantModel",
                              "assistant_params_mb": _param_mb(dflash)}

    items = build_items(tokenizer, target, prompts, config.max_new_tokens)
    static_capacity = 0
    if "ar-compiled" in config.methods:
        from ..generation.static_rounds import capacity_for

        static_capacity = capacity_for(max(ids.shape[1] for _, ids in items) + config.max_new_tokens + 32)
        extra["ar-compiled"] = {"static_cache_positions": static_capacity,
                                "compile_config": compiled_plain_config(device.type, config.compile_backend).to_dict()}
    sampling = config.temperature > 0
    gen_kwargs = dict(max_new_tokens=config.max_new_tokens, do_sample=sampling)
    if sampling:
        gen_kwargs.update(temperature=config.temperature, top_k=0, top_p=config.top_p)
    else:
        gen_kwargs.update(temperature=None, top_k=None, top_p=None)
    setup = BenchSetup(target, tokenizer, items, gen_kwargs, extra, drafter, assistant, dflash, baseline, drafter_free, lm_source=lm_source,
                       static_capacity=static_capacity)
    if "jetspec-online" in variants:
        from ..training.online import OnlineLearningConfig

        learning = OnlineLearningConfig(steps_per_call=config.learn_steps, time_share=config.learn_share, lr=config.learn_lr,
                                        seed=config.seed)
        setup.online = online
        setup.extra["jetspec-online"]["online_learning"] = asdict(learning)
        setup.online_config = learning
    for name, free in drafter_free.items():
        setup.memories[name] = free.output_memory  # cleared after the warm-up like the others
    return setup


def _drafter_of(setup: BenchSetup, name: str):
    """The drafter a jetspec variant generates with."""
    if name == "jetspec-online":
        return setup.online
    return setup.baseline if name == "jetspec-baseline" else setup.drafter


def _use_method(setup: BenchSetup, config: BenchConfig, name: str) -> dict:
    """Generate kwargs of one method; for a jetspec variant, switch the drafter to its options and memory."""
    if name == "prompt-lookup":
        return {"prompt_lookup_num_tokens": config.prompt_lookup_tokens}
    if name == "ar-compiled":
        return {"cache_implementation": "static", "max_cache_len": setup.static_capacity,
                "compile_config": compiled_plain_config(setup.target.device.type, config.compile_backend)}
    if name in JETSPEC_VARIANTS:
        from ..drafter.drafting_config import DraftingConfig
        from ..policy import OutputMemory

        drafter = _drafter_of(setup, name)
        drafter.drafting_config = DraftingConfig(**setup.extra[name]["drafting_config"])
        assistant_for(drafter).output_memory = setup.memories.setdefault(name, OutputMemory())  # no variant learns from another's outputs
        assistant_for(drafter).lm_source = setup.lm_source if name == "jetspec-lm" else None
        return {"assistant_model": drafter}
    if name in DRAFTER_FREE_VARIANTS:
        return {"assistant_model": setup.drafter_free[name]}
    if name == "assisted":
        return {"assistant_model": setup.assistant}
    if name == "hf-dflash":
        return {"assistant_model": setup.dflash_assistant, "speculation_type": "dflash"}
    return {}


def compiled_plain_config(device_type: str, backend: str = "inductor"):
    """transformers' ``CompileConfig`` of the ``ar-compiled`` peer: a static-shape graph, inductor with
    the settings compiled rounds use (frozen weights on CPU, CUDA graphs on CUDA), on any device."""
    from transformers import CompileConfig


    if backend != "inductor":
        config = CompileConfig(fullgraph=False, dynamic=False, backend=backend, mode=None)
    else:  # CPU: inductor's settings (frozen weights) are set around the call (see ``_compile_settings``)
        config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if device_type == "cuda" else None)
    config._compile_all_devices = True  # transformers compiles on accelerators only unless told
    return config


def left_pad(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts ``[1, n_i]`` as one left-padded batch: ``(input_ids, attention_mask)``.

    >>> ids, mask = left_pad([torch.tensor([[5, 6]]), torch.tensor([[7]])], 0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [0, 7]], [[1, 1], [0, 1]])
    """
    width = max(r.shape[1] for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=rows[0].dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - r.shape[1]:] = r[0]
        mask[b, width - r.shape[1]:] = 1
    return ids, mask


def row_tokens(generated: list[int], eos: set[int]) -> list[int]:
    """A batch row's own tokens: up to and including its first EOS (the padding after it dropped).

    >>> row_tokens([4, 9, 2, 0, 0], {2})
    [4, 9, 2]
    """
    for i, t in enumerate(generated):
        if t in eos:
            return generated[: i + 1]
    return generated


def run_batched(setup: BenchSetup, config: BenchConfig, progress: bool = True) -> dict[str, MethodRecord]:
    """``run_methods`` for ``config.batch_size`` > 1: the items in file order, ``batch_size`` at a time,
    left-padded into one ``generate`` call per method (rotating order, after an untimed warm-up on the
    first batch). Each row is recorded as its own item (its tokens up to its EOS, its output, its share
    of the call's seconds by tokens), so ``tokens_per_s`` is the throughput across the batch and
    ``exact_match_vs_ar`` compares row by row with transformers' batched plain decoding."""
    from tqdm.auto import tqdm

    target, device = setup.target, setup.target.device
    methods = [m for m in config.methods if m in BATCH_METHODS]
    for name in config.methods:
        if name not in BATCH_METHODS:
            setup.extra.setdefault(name, {})["unavailable"] = BATCH_UNAVAILABLE.get(
                name, BATCH_JETSPEC_UNAVAILABLE if name in JETSPEC_VARIANTS else "runs one row at a time: run it with --batch-size 1")
    eos_id = target.generation_config.eos_token_id
    eos = set(eos_id if isinstance(eos_id, (list, tuple)) else [eos_id]) - {None}
    pad = setup.tokenizer.pad_token_id if setup.tokenizer.pad_token_id is not None else next(iter(eos), 0)
    batches = [setup.items[i : i + config.batch_size] for i in range(0, len(setup.items), config.batch_size)]

    def run_one(name, batch, seed, max_new_tokens):
        ids, mask = left_pad([item[1] for item in batch], pad)
        kwargs = {**setup.gen_kwargs, "max_new_tokens": max_new_tokens, "pad_token_id": pad, **_use_method(setup, config, name)}
        torch.manual_seed(seed)
        with PeakMemory(device) as mem:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = target.generate(ids.to(device), attention_mask=mask.to(device), **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
        rows = [row_tokens(out[b, ids.shape[1]:].tolist(), eos) for b in range(len(batch))]
        return rows, elapsed, mem.peak_mb

    for name in methods:
        run_one(name, batches[0], config.seed, config.warmup_tokens)
    for memory in setup.memories.values():
        memory.clear()
    records = {name: MethodRecord(name) for name in methods}
    bar = tqdm(total=len(batches) * len(methods), desc=f"bench, batches of {config.batch_size}", disable=not progress)
    for i, batch in enumerate(batches):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for name in order:
            rows, elapsed, peak = run_one(name, batch, config.seed + i, config.max_new_tokens)
            rec = records[name]
            total = max(sum(map(len, rows)), 1)
            for tokens in rows:
                rec.tokens.append(len(tokens))
                rec.seconds.append(elapsed * len(tokens) / total)
                rec.outputs.append(tokens)
            rec.peak_memory_mb = max(rec.peak_memory_mb, peak)
            if name in DRAFTER_FREE_VARIANTS:
                _add_generation_stats(rec, setup.drafter_free[name].generation_stats)
            elif name in JETSPEC_VARIANTS:
                _add_generation_stats(rec, _drafter_of(setup, name).generation_stats)
            bar.update(1)
            bar.set_postfix_str(f"batch {i + 1} {name} {total / elapsed:.1f} tok/s")
    bar.close()
    return records


def run_methods(setup: BenchSetup, config: BenchConfig, progress: bool = True, deadline: float | None = None) -> dict[str, MethodRecord]:
    """Warm every method up, then run them interleaved prompt by prompt (rotating order). With a
    ``deadline`` (``time.perf_counter()``), no item starts after it but the first (every method
    then has the same items)."""
    from tqdm.auto import tqdm

    target, device = setup.target, setup.target.device

    def run_one(name, ids, seed, max_new_tokens):
        counter = RoundCounter()
        kwargs = {**setup.gen_kwargs, "max_new_tokens": max_new_tokens, **_use_method(setup, config, name)}
        torch.manual_seed(seed)
        ids = ids.to(device)
        with PeakMemory(device) as mem:
            t0 = time.perf_counter()
            with torch.no_grad():
                if name == "ar-static":
                    from ..generation.static_rounds import static_greedy

                    eos = target.generation_config.eos_token_id
                    out = static_greedy(target, ids, max_new_tokens, eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [],
                                        config.compile_backend)
                else:
                    out = target.generate(ids, attention_mask=torch.ones_like(ids), streamer=counter, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - t0
        counter.first_chunk_s = (counter.first_at - t0) if counter.first_at is not None else elapsed
        return out[0, ids.shape[1] :].tolist(), elapsed, counter, mem.peak_mb

    items = setup.items
    methods = list(config.methods)
    longest = max(items, key=lambda item: item[1].shape[1])[1]
    for name in config.methods:  # warm-up: every code path once, untimed
        try:
            compiled = name in ("ar-compiled", "ar-static") or (name in JETSPEC_VARIANTS and (
                setup.extra[name]["drafting_config"]["compile"] or setup.extra[name]["drafting_config"]["compiled_rounds"]))
            if compiled:
                # compile every graph the timed runs need (each cache capacity up to the longest context)
                t0 = time.perf_counter()
                run_one(name, longest, config.seed, config.max_new_tokens)
                setup.extra.setdefault(name, {})["compile_warmup_s"] = round(time.perf_counter() - t0, 1)
                if name in JETSPEC_VARIANTS and setup.extra[name]["drafting_config"]["compiled_rounds"]:
                    _record_static_target(setup, name)
            else:
                run_one(name, items[0][1], config.seed, config.warmup_tokens)
        except Exception as err:
            if name != "hf-dflash":
                raise
            # transformers' DFlash path may assume its own model families: report why, run the rest
            setup.extra[name]["unavailable"] = f"transformers' DFlash generation failed on this target: {type(err).__name__}: {err}"
            methods.remove(name)
    for memory in setup.memories.values():  # the warm-up output must not help the timed runs
        memory.clear()
    learner = None
    if setup.online is not None:  # learning starts with the first timed item (its set-up counted there)
        learner = assistant_for(setup.online).learn_online(setup.online_config, target=target)

    records = {name: MethodRecord(name) for name in methods}
    bar = tqdm(total=len(items) * len(methods), desc="bench", disable=not progress)
    for i, (item_id, ids) in enumerate(items):
        if deadline is not None and i > 0 and time.perf_counter() >= deadline:
            break
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for name in order:
            tokens, elapsed, counter, peak = run_one(name, ids, config.seed + i, config.max_new_tokens)
            rec = records[name]
            rec.tokens.append(len(tokens))
            rec.seconds.append(elapsed)
            rec.outputs.append(tokens)
            rec.first_chunk_s.append(counter.first_chunk_s)
            rec.first_chunk_tokens.append(counter.chunks[0] if counter.chunks else len(tokens))
            rec.peak_memory_mb = max(rec.peak_memory_mb, peak)
            if name in JETSPEC_VARIANTS:
                _add_generation_stats(rec, _drafter_of(setup, name).generation_stats)
                if name == "jetspec-online":
                    rec.learn_seconds.append(learner.learn_seconds[-1] if learner.learn_seconds else 0.0)
            elif name in DRAFTER_FREE_VARIANTS:
                _add_generation_stats(rec, setup.drafter_free[name].generation_stats)
            elif name not in PLAIN_METHODS:
                # transformers' DFlash loop spends its first step on the prefill alone (no draft): count
                # drafting rounds only, as the JetSpec statistics do
                chunks = counter.chunks[1:] if name == "hf-dflash" else counter.chunks
                rec.committed.append(sum(chunks))
                rec.rounds.append(len(chunks))
                rec.accepted.append([c - 1 for c in chunks])
            bar.update(1)
            bar.set_postfix_str(f"{item_id} {name} {len(tokens) / elapsed:.1f} tok/s")
    bar.close()
    if learner is not None:
        setup.extra["jetspec-online"]["learner"] = learner.summary() | {"guard_history": learner.guard_history}
    for extra in setup.extra.values():  # compiled rounds: graphs compiled by the end (equal to the warm-up's: none in the timed runs)
        runner = extra.pop("_runner", None)
        if runner is not None:
            extra["static_target"]["graphs_after_runs"] = runner.compiles
    return records


def _record_static_target(setup: BenchSetup, name: str) -> None:
    """A compiled-rounds method's static target: its buckets' measured seconds, capacity, warm-up and
    compile count (kept so that the count after the timed runs shows they compiled nothing)."""
    from ..generation.static_rounds import RUNNERS_ATTRIBUTE

    runners = [r for r in setup.target.__dict__.get(RUNNERS_ATTRIBUTE, {}).values() if r.hidden_layers]  # ar-static's reads none
    if runners:
        runner = max(runners, key=lambda r: r.capacity)
        setup.extra[name]["static_target"] = {
            "capacity": runner.capacity, "read_layers": runner.hidden_layers, "bucket_ms": {str(b): round(1000 * s, 2) for b, s in runner.seconds.items()},
            "target_warmup_s": round(runner.warmup_s, 1), "graphs_after_warmup": runner.compiles}
        setup.extra[name]["_runner"] = runner


def _add_generation_stats(rec: MethodRecord, stats: GenerationStats) -> None:
    rec.committed.append(stats.committed_tokens)
    rec.rounds.append(stats.rounds)
    rec.accepted.append(list(stats.accepted_lengths))
    rec.stats = stats if rec.stats is None else rec.stats.merge(stats)


def measure_tie_margin(target, tokenizer, config: BenchConfig) -> dict:
    """The target's logit noise in its dtype (1-token steps against 16-token forwards) on held-out prompts.

    The prompts are ``tie_margin_items`` of the same set, never benchmarked ones: from
    ``offset + limit + 100`` of the set's fixed shuffle, or right after the benchmarked prompts when
    the set is too small for that gap; continued by the target's own greedy decoding. A long-prompt
    set has no prompts to spare: its margin comes from GSM8K prompts far past any benchmarked ones.
    """
    from ..data import load_eval_prompts
    from ..data.long_prompts import parse_long_set
    from .numerics import logit_noise, tie_margin_from_noise

    source = config.prompts
    after = config.offset + (config.limit or 0)
    if parse_long_set(str(source)) is not None:
        source, after = "gsm8k", 1000
    offset = after + 100
    prompts = load_eval_prompts(source, limit=config.tie_margin_items, seed=config.seed, offset=offset)
    if len(prompts) < config.tie_margin_items:
        offset = after
        prompts = load_eval_prompts(source, limit=config.tie_margin_items, seed=config.seed, offset=offset)
    if not prompts:
        raise ValueError(f"no held-out prompts left in {config.prompts!r} after the benchmarked ones for the tie margin; "
                         "lower --limit or pass --tie-margin-items 0")
    items = build_items(tokenizer, target, prompts, min(config.max_new_tokens, 128))[: config.tie_margin_items]
    noise = []
    for _, ids in items:
        ids = ids.to(target.device)
        with torch.no_grad():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=min(config.max_new_tokens, 128))
        noise.append(logit_noise(target, out, ids.shape[1], block=16).cpu())
    values = torch.cat(noise)
    return {
        "tie_margin": tie_margin_from_noise(values, 0.999),
        "noise_quantile": 0.999,
        "noise_positions": int(values.numel()),
        "noise_max": float(values.max()),
        "noise_median": float(values.median()),
        "prompts": source,
        "prompts_offset": offset,
        "block": 16,
    }


def score_divergences(config: BenchConfig, setup: BenchSetup, records: dict[str, MethodRecord], tie: dict) -> dict[str, dict]:
    """Per method: the first divergence from AR on every prompt where they differ, scored in fp32."""
    from .numerics import score_divergence, tie_explained
    from .targets import load_target

    reference = setup.target
    if setup.target.dtype != torch.float32:
        reference, _ = load_target(config.target, dtype=torch.float32, device=setup.target.device)
    ar = records["ar"]
    out = {}
    for name, rec in records.items():
        if name == "ar":
            continue
        divs = []
        for i, (item_id, ids) in enumerate(setup.items):
            d = score_divergence(reference, ids, ar.outputs[i], rec.outputs[i], i)
            if d is not None:
                divs.append(d)
        out[name] = {
            "divergences": [d.to_dict() for d in divs],
            "tie_explained_vs_ar": tie_explained(divs, tie["tie_margin"]) if tie else None,
        }
    compiled_ar = records.get("ar-compiled")
    if compiled_ar is not None:  # compiled and eager kernels round differently: compiled methods against compiled plain decoding too
        for name, rec in records.items():
            if name in ("ar", "ar-compiled"):
                continue
            divs = [d for i, (_, ids) in enumerate(setup.items)
                    if (d := score_divergence(reference, ids, compiled_ar.outputs[i], rec.outputs[i], i)) is not None]
            out[name]["divergences_vs_ar_compiled"] = [d.to_dict() for d in divs]
            out[name]["tie_explained_vs_ar_compiled"] = tie_explained(divs, tie["tie_margin"]) if tie else None
    return out


def dump_json(data, indent: int = 1) -> str:
    """JSON with nested objects indented and every list of plain values on one line: result files
    stay readable and a few times smaller than one value per line (token-id outputs, histograms).

    >>> print(dump_json({"a": [1, 2], "b": {"c": None}}), end="")
    {
     "a": [1, 2],
     "b": {
      "c": null
     }
    }
    """

    def scalar(x):
        return x is None or isinstance(x, (bool, int, float, str))

    def enc(x, depth):
        pad, inner = " " * (indent * depth), " " * (indent * (depth + 1))
        if isinstance(x, dict):
            if not x:
                return "{}"
            return "{\n" + ",\n".join(f"{inner}{json.dumps(str(k))}: {enc(v, depth + 1)}" for k, v in x.items()) + "\n" + pad + "}"
        if isinstance(x, (list, tuple)):
            if all(scalar(v) for v in x):
                return json.dumps(list(x))
            return "[\n" + ",\n".join(inner + enc(v, depth + 1) for v in x) + "\n" + pad + "]"
        return json.dumps(x)

    return enc(data, 0) + "\n"


def decode_rate(tokens: list[int], seconds: list[float], first_tokens: list[int], first_seconds: list[float]) -> float:
    """Tokens per second after each generation's first delivered chunk (what TPOT measures).

    >>> decode_rate([11, 21], [3.0, 5.0], [1, 1], [1.0, 1.0])
    5.0
    """
    rest = sum(max(t - f, 0) for t, f in zip(tokens, first_tokens))
    span = sum(max(s - f, 0.0) for s, f in zip(seconds, first_seconds))
    return rest / span if span > 0 else 0.0


def summarise(config: BenchConfig, setup: BenchSetup, records: dict[str, MethodRecord], numerics: dict | None) -> dict:
    """The result dict: per-method metrics (through the ``evaluate`` modules), config and environment."""
    from .dtypes import dtype_name
    from ..metrics import load as load_metric

    acceptance, speedup, exact = load_metric("acceptance_length"), load_metric("speedup"), load_metric("exact_match")
    sampling = config.temperature > 0
    ar = records.get("ar")
    methods = {}
    for name, rec in records.items():
        entry = {
            "tokens_per_s": sum(rec.tokens) / sum(rec.seconds),
            "new_tokens": sum(rec.tokens),
            "seconds": sum(rec.seconds),
            "seconds_per_item": rec.seconds,  # with ``outputs``: per-prompt speeds, e.g. over prompts where two methods wrote the same text
            "tau": None,
            "rounds": None,
            "accept_length_hist": None,
            "speedup_vs_ar": None,
            "exact_match_vs_ar": None,
            "draft_time_s": None,
            "verify_time_s": None,
            "peak_memory_mb": rec.peak_memory_mb,
        }
        if name not in PLAIN_METHODS:
            acc = acceptance.compute(committed_tokens=rec.committed, rounds=rec.rounds, accepted_lengths=rec.accepted)
            entry.update(tau=acc["tau"], rounds=acc["rounds"], accept_length_hist=acc["accept_length_hist"])
            entry.update(tau_per_item(rec.committed, rec.rounds))
        if rec.learn_seconds:
            entry["learn_seconds_per_item"] = [round(x, 4) for x in rec.learn_seconds]
            entry["learn_share_of_wall"] = sum(rec.learn_seconds) / sum(rec.seconds)
        if rec.first_chunk_s:
            # decoding alone: after the first delivered chunk (the prefill, the same forward for every method)
            entry["first_chunk_s_per_item"] = [round(x, 4) for x in rec.first_chunk_s]
            entry["first_chunk_tokens_per_item"] = rec.first_chunk_tokens
            entry["decode_tokens_per_s"] = decode_rate(rec.tokens, rec.seconds, rec.first_chunk_tokens, rec.first_chunk_s)
            if ar is not None and ar.first_chunk_s:
                entry["decode_speedup_vs_ar"] = entry["decode_tokens_per_s"] / decode_rate(ar.tokens, ar.seconds, ar.first_chunk_tokens, ar.first_chunk_s)
        compiled_ar = records.get("ar-compiled")
        if compiled_ar is not None and name != "ar-compiled":  # against the best plain path, like with like
            entry["speedup_vs_ar_compiled"] = speedup.compute(tokens=rec.tokens, seconds=rec.seconds, baseline_tokens=compiled_ar.tokens,
                                                              baseline_seconds=compiled_ar.seconds)["speedup"]
            if not sampling:
                entry["exact_match_vs_ar_compiled"] = exact.compute(predictions=rec.outputs, references=compiled_ar.outputs)["exact_match"]
        static_ar = records.get("ar-static")
        if static_ar is not None and name != "ar-static":  # against plain steps through the same compiled forward
            entry["speedup_vs_ar_static"] = speedup.compute(tokens=rec.tokens, seconds=rec.seconds, baseline_tokens=static_ar.tokens,
                                                            baseline_seconds=static_ar.seconds)["speedup"]
        if ar is not None:
            entry["speedup_vs_ar"] = speedup.compute(tokens=rec.tokens, seconds=rec.seconds, baseline_tokens=ar.tokens, baseline_seconds=ar.seconds)["speedup"]
            if not sampling:
                entry["exact_match_vs_ar"] = exact.compute(predictions=rec.outputs, references=ar.outputs)["exact_match"]
        if rec.stats is not None:
            st = rec.stats
            n_rounds = max(1, st.rounds)
            entry.update(
                draft_time_s=st.draft_time_s,
                verify_time_s=st.verify_time_s,
                exposed_draft_ms_per_round=1000 * st.draft_time_s / n_rounds,
                background_draft_ms_per_round=1000 * st.background_time_s / n_rounds,
                hit_rate=st.hit_rate,
                context_refreshes=st.refreshes,
                source_counts=st.source_counts or None,
                chosen_length_hist=st.chosen_length_hist or None,
                drafter_runs=st.drafter_runs,
                cost_model=st.cost_model or None,
                sampled_drafts=st.sampled_drafts,
                position_acceptance={source or "all": st.position_acceptance(source) for source in (None, "drafter", "ngram")} if not st.tree_nodes else None,
            )
            if st.lm_tokens:  # an LM source: what it proposed, what verification saw and kept, and its time
                entry.update(lm_tokens=st.lm_tokens, lm_nodes=st.lm_nodes, lm_accepted=st.lm_accepted, lm_time_s=st.lm_time_s)
            if st.tree_nodes:
                entry.update(
                    nodes_per_round=sum(st.tree_nodes) / len(st.tree_nodes),
                    off_chain_share=sum(off for _, off in st.tree_paths) / len(st.tree_paths),
                )
        if numerics and name in numerics.get("methods", {}):
            entry.update(numerics["methods"][name])
        entry.update(setup.extra.get(name, {}))
        entry["outputs"] = rec.outputs  # generated token ids per item, for quality checks and replays
        methods[name] = entry
    for name in set(config.methods) - set(records):  # methods that could not run here, and why
        methods[name] = dict(setup.extra.get(name, {}))
    result = {
        "methods": methods,
        "config": asdict(config) | {"num_items": len(setup.items), "items": [i for i, _ in setup.items], "target_dtype": dtype_name(setup.target.dtype)},
        "environment": describe_environment(setup.target.device),
    }
    if numerics:
        result["numerics"] = {k: v for k, v in numerics.items() if k != "methods"}
    return result


def tau_per_item(committed: list[int], rounds: list[int]) -> dict:
    """Tau (committed tokens per round) of each item, and over the second half of the items
    (``tau_last_half``: where a learning method has learnt from the first half)."""
    per_item = [c / r if r else None for c, r in zip(committed, rounds)]
    half = len(committed) // 2
    late_c, late_r = sum(committed[half:]), sum(rounds[half:])
    return {"tau_per_item": [None if t is None else round(t, 4) for t in per_item],
            "tau_last_half": late_c / late_r if late_r else None}


def run_bench(config: BenchConfig, progress: bool = True) -> dict:
    """Run the benchmark described by ``config`` and return the result dict (also saved if ``output``).

    Outside fp32, greedy runs also measure the target's tie margin and score every divergence from AR
    in fp32 (:mod:`hf_jetspec.tools.numerics`)."""
    setup = load_bench(config)
    score = config.temperature == 0 and "ar" in config.methods and len(config.methods) > 1
    tie = {}
    if score and setup.target.dtype != torch.float32 and config.tie_margin_items > 0:
        tie = measure_tie_margin(setup.target, setup.tokenizer, config)  # before the timed runs: fails fast
    records = run_methods(setup, config, progress) if config.batch_size == 1 else run_batched(setup, config, progress)
    numerics = {**tie, "methods": score_divergences(config, setup, records, tie)} if score else None
    result = summarise(config, setup, records, numerics)
    if config.output:
        out = Path(config.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(dump_json(result))
        plot_result(result, out.with_suffix(".png"))
        if "jetspec-online" in result["methods"]:
            plot_tau_over_items(result, out.with_name(out.stem + "_tau.png"))
    return result


def _param_mb(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


def markdown_table(result: dict) -> str:
    compiled = "ar-compiled" in result["methods"] and "tokens_per_s" in result["methods"]["ar-compiled"]
    cols = ["method", "tok/s", "speedup vs AR", *(["vs compiled AR"] if compiled else []), "tau", "exact vs AR", "rounds", "draft s",
            "verify s", "hit rate", "peak extra MB"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def fmt(v, spec="{:.2f}"):
        return "-" if v is None else spec.format(v)

    for name, m in result["methods"].items():
        if "tokens_per_s" not in m:
            lines.append(f"| {name} | not run: {m.get('unavailable', 'unavailable')} |")
            continue
        lines.append(
            "| "
            + " | ".join([
                name,
                fmt(m["tokens_per_s"], "{:.1f}"),
                fmt(m["speedup_vs_ar"], "{:.2f}x"),
                *([fmt(m.get("speedup_vs_ar_compiled", 1.0 if name == "ar-compiled" else None), "{:.2f}x")] if compiled else []),
                fmt(m["tau"]),
                fmt(m["exact_match_vs_ar"]),
                fmt(m["rounds"], "{}"),
                fmt(m["draft_time_s"], "{:.1f}"),
                fmt(m["verify_time_s"], "{:.1f}"),
                fmt(m.get("hit_rate")),
                fmt(m["peak_memory_mb"], "{:.0f}"),
            ])
            + " |"
        )
    return "\n".join(lines)


def plot_result(result: dict, path: str | os.PathLike) -> None:
    """Acceptance-length histograms and per-method tok/s, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = result["methods"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, m in methods.items():
        hist = m.get("accept_length_hist")
        if hist:
            total = sum(hist)
            ax1.plot(range(len(hist)), [h / total for h in hist], marker="o", label=f"{name} (tau {m['tau']:.2f})")
    ax1.set_xlabel("accepted draft tokens per round")
    ax1.set_ylabel("share of rounds")
    ax1.legend()
    ax1.set_title("acceptance length")
    names = [n for n in methods if "tokens_per_s" in methods[n]]
    ax2.bar(names, [methods[n]["tokens_per_s"] for n in names], color="tab:blue")
    ax2.set_ylabel("tokens / s")
    cfg = result["config"]
    ax2.set_title(f"{cfg['target']} on {cfg['prompts']} ({cfg['num_items']} items, {cfg['max_new_tokens']} new tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_tau_over_items(result: dict, path: str | os.PathLike) -> None:
    """Tau per item (in stream order) of every method that drafts, with a running mean, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for name, m in result["methods"].items():
        taus = m.get("tau_per_item")
        if not taus:
            continue
        xs = [i for i, t in enumerate(taus) if t is not None]
        ys = [taus[i] for i in xs]
        running = [sum(ys[max(0, j - 9) : j + 1]) / len(ys[max(0, j - 9) : j + 1]) for j in range(len(ys))]
        line, = ax.plot(xs, ys, ".", alpha=0.35)
        ax.plot(xs, running, color=line.get_color(), label=f"{name} (last half {m['tau_last_half']:.2f})")
    cfg = result["config"]
    ax.set_xlabel("item (stream order)")
    ax.set_ylabel("tau (committed tokens per round)")
    ax.set_title(f"{cfg['target']} on {cfg['prompts']}: tau over the stream (dots: items, lines: mean of the last 10)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
