"""Rounds on a static cache, with the target's verification forward compiled per width bucket.

``DraftingConfig(compiled_rounds=True)`` is the switch. Tree rounds (:mod:`.tree_decoding`) then
verify through a :class:`StaticTarget` instead of an eager forward on a dynamic cache:

- **The cache** is one ``transformers.StaticCache`` per target, process and capacity, reused by every
  call. Its capacity is the call's ``max_length`` plus the widest bucket, rounded up to
  :data:`CAPACITY_STEP`, so that calls of similar lengths share one set of graphs; a call that needs
  more builds a larger one (and compiles again, once).
- **A round** writes ``[anchor] + nodes`` at the cache's current length, padded at the end to the
  smallest bucket that is cheapest for that width (:func:`bucket_for`). Padded rows attend to
  themselves only and no real row attends to them, so they change nothing real; the mask covers the
  whole capacity (:func:`static_verification_mask`), so one graph per bucket serves every context
  length. After the walk, the accepted rows move down into place (:meth:`StaticTarget.keep_rows`)
  and the length is set: rejected and padded rows are left behind, to be overwritten.
- **Prefill** runs eagerly on the same cache (one forward per call, of a length no graph would share).
- **Warm-up** compiles every bucket once, when the first call on a target builds its
  :class:`StaticTarget`, and times each compiled bucket: those times are the round policy's cost
  profile (:meth:`StaticTarget.profile`), so widths are priced as they will run. The compile count
  is kept (:attr:`StaticTarget.compiles`): after warm-up a call compiles nothing.
- **Devices.** On CPU the graphs are built by inductor with weight freezing (the weights are
  constants of the graph, pre-packed for the CPU kernels: a target whose weights change after its
  first compiled call needs its :data:`RUNNERS_ATTRIBUTE` entry dropped). On CUDA the mode is
  ``reduce-overhead`` (each bucket captured as a CUDA graph); outputs are copied out before the next replay.
- **What it buys.** SmolLM2-135M in bf16 on two CPU cores, over a 200-token cache: 16 tokens compiled
  cost 36.8 ms against 45.0 ms for one eager token, 8 tokens 29.2 ms (``benchmarks/static_rounds_cost.py``).

Sliding-window layers keep a cache that drops rows by count, and a given four-dimensional mask
switches transformers' window masking off, so targets with them get a clear error. The drafter's
own step compiles with it (:mod:`hf_jetspec.drafter.compiled_step`). ``benchmarks/static_rounds_cost.py``
measures the forward costs both ways.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from .cache_rows import move_rows_down

CAPACITY_STEP = 512  # static cache capacities are multiples of this many positions
MAX_GRAPHS = 64  # graphs dynamo may hold for the verification forward (buckets x capacities x targets in one process)


def default_buckets(max_width: int) -> tuple[int, ...]:
    """Verify widths compiled for rounds of up to ``max_width`` tokens: 1, then 8, 16, 32, ... up to
    the first that holds ``max_width``.

    >>> default_buckets(16), default_buckets(17), default_buckets(5)
    ((1, 8, 16), (1, 8, 16, 32), (1, 8))
    """
    buckets, width = [1], 8
    while buckets[-1] < max_width:
        buckets.append(width)
        width *= 2
    return tuple(buckets)


def bucket_for(width: int, buckets: tuple[int, ...], seconds: dict[int, float] | None = None) -> int:
    """The bucket a forward of ``width`` tokens runs in: of the buckets that hold it, the one with the
    least measured ``seconds`` (ties and unmeasured buckets: the smallest).

    >>> bucket_for(3, (1, 8, 16)), bucket_for(1, (1, 8, 16), {1: 0.048, 8: 0.038, 16: 0.045})
    (8, 8)
    >>> bucket_for(9, (1, 8, 16), {1: 0.048, 8: 0.038, 16: 0.045})
    16
    """
    fits = [b for b in sorted(buckets) if b >= width]
    if not fits:
        raise ValueError(f"a {width}-token forward fits no compiled bucket {tuple(buckets)}")
    if not seconds or any(b not in seconds for b in fits):
        return fits[0]
    return min(fits, key=lambda b: (seconds[b], b))


def capacity_for(needed: int, step: int = CAPACITY_STEP) -> int:
    """``needed`` positions rounded up to a multiple of ``step``.

    >>> capacity_for(300), capacity_for(512), capacity_for(513)
    (512, 512, 1024)
    """
    return max(step, -(-int(needed) // step) * step)


def static_verification_mask(inner: torch.Tensor, context: int, bucket: int, capacity: int) -> torch.Tensor:
    """[1, 1, bucket, capacity] boolean mask (True = attend) of a forward written at ``context``.

    ``inner`` [n, n] is the mask among the forward's real rows (a tree's ancestry, or causal for a
    chain). Real rows see the ``context`` cached rows and, by ``inner``, each other; padded rows
    (``n .. bucket - 1``) see themselves only; nothing sees past ``context + bucket``.

    >>> m = static_verification_mask(torch.tensor([[True, False], [True, True]]), 2, 3, 8)[0, 0].int()
    >>> m.tolist()
    [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0]]
    """
    n = inner.shape[0]
    if n > bucket or context + bucket > capacity:
        raise ValueError(f"{n} rows at position {context} do not fit bucket {bucket} in a cache of {capacity}")
    mask = torch.zeros(bucket, capacity, dtype=torch.bool)
    mask[:n, :context] = True
    mask[:n, context : context + n] = inner
    pad = torch.arange(n, bucket)
    mask[pad, context + pad] = True
    return mask[None, None]


def sliding_window_reason(cache) -> str | None:
    """Why compiled rounds cannot run on ``cache`` (a StaticCache), or None."""
    sliding = [i for i, layer in enumerate(getattr(cache, "layers", [])) if getattr(layer, "is_sliding", False)]
    if sliding:
        return (f"has sliding-window layers ({len(sliding)} of {len(cache.layers)}), whose static cache drops rows by count "
                "and whose window a given tree mask does not apply")
    return None


@dataclass
class CountingBackend:
    """A ``torch.compile`` backend that counts the graphs it is asked to compile, then hands each to
    ``backend``. Inductor's settings are not given here: freezing must be on while dynamo traces
    (it decides then to treat the weights as constants), so :class:`StaticTarget` sets them around
    every call (:func:`inductor_options`)."""

    backend: str = "inductor"
    compiles: int = 0

    def __call__(self, graph, example_inputs):
        self.compiles += 1
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(graph, example_inputs)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.backend)(graph, example_inputs)


@contextmanager
def compile_settings(inductor: dict):
    """Around a compiled call: inductor's ``settings`` (read while dynamo traces and inductor compiles),
    and room for :data:`MAX_GRAPHS` graphs (every StaticTarget's graphs share one code object)."""
    import torch._inductor.config as inductor_config

    with torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS), inductor_config.patch(inductor):
        yield


def inductor_options(device_type: str) -> dict:
    """Inductor's settings for a target on ``device_type``: frozen weights on CPU, CUDA graphs on CUDA."""
    if device_type == "cuda":
        from torch._inductor import list_mode_options

        return dict(list_mode_options("reduce-overhead"))
    return {"freezing": True} if device_type == "cpu" else {}


class StaticTarget:
    """A target's verification forwards on a static cache, compiled once per width bucket.

    ``verify(ids, positions, inner, context)`` returns an object with ``logits`` [1, n, V] and
    ``hidden_states`` (a dict from each read layer index to its [1, n, H] states) for the ``n`` real
    rows. ``keep_rows`` and ``set_length`` move the cache on after the walk."""

    def __init__(self, target, capacity: int, buckets: tuple[int, ...], hidden_layers: list[int], backend: str = "inductor"):
        from transformers import StaticCache

        self.target = target
        self.capacity = int(capacity)
        self.buckets = tuple(sorted(set(buckets)))
        self.hidden_layers = list(hidden_layers)
        self.cache = StaticCache(config=target.config, max_cache_len=self.capacity)
        reason = sliding_window_reason(self.cache)
        if reason is not None:
            raise ValueError(f"compiled rounds need a full-attention static cache; {type(target).__name__} {reason}. "
                             "Run with compiled_rounds=False (eager rounds keep chain rounds for such targets).")
        device_type = target.device.type
        self.backend = CountingBackend(backend)
        self.inductor_settings = inductor_options(device_type) if backend == "inductor" else {}
        self.copy_outputs = device_type == "cuda" and backend == "inductor"  # a replayed CUDA graph overwrites its outputs
        self._compiled = torch.compile(self._forward, backend=self.backend, dynamic=False, fullgraph=False)
        self.seconds: dict[int, float] = {}
        self.warmup_s = 0.0
        self.calls = 0

    @property
    def compiles(self) -> int:
        """Graphs compiled so far (warm-up included)."""
        return self.backend.compiles

    def _forward(self, ids, positions, mask):
        out = self.target(input_ids=ids, position_ids=positions, attention_mask=mask, cache=self.cache, use_cache=True,
                          output_hidden_states=bool(self.hidden_layers))
        return out.logits, tuple(out.hidden_states[i] for i in self.hidden_layers)

    # -- cache bookkeeping -------------------------------------------------------------------
    def length(self) -> int:
        return int(self.cache.layers[0].cumulative_length) if self.cache.layers[0].is_initialized else 0

    def set_length(self, length: int) -> None:
        """Make ``length`` the cache's length: later writes start there; rows past it are stale."""
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(int(length))

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Keep, of the rows written from ``start`` on, only ``rows`` (increasing offsets), moved down
        into place; the length becomes ``start + len(rows)``."""

        move_rows_down(self.cache.layers, start, rows)
        self.set_length(start + len(rows))

    # -- forwards ----------------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor):
        """The prompt's eager forward from an empty cache (hidden states of every layer)."""
        self.set_length(0)
        n = ids.shape[1]
        if n + self.buckets[-1] > self.capacity:
            raise ValueError(f"a {n}-token prompt leaves no room in a static cache of {self.capacity}")
        return self.target(input_ids=ids, position_ids=torch.arange(n, device=ids.device)[None], cache=self.cache,
                           use_cache=True, output_hidden_states=bool(self.hidden_layers))

    def verify(self, ids: torch.Tensor, positions: torch.Tensor, inner: torch.Tensor, context: int):
        """The compiled forward of ``ids`` [1, n] at ``positions`` [1, n], written at ``context``."""
        n = ids.shape[1]
        bucket = bucket_for(n, self.buckets, self.seconds)
        device = ids.device
        if bucket > n:
            pad = bucket - n
            ids = torch.cat([ids, ids[:, -1:].expand(1, pad)], dim=1)
            positions = torch.cat([positions, positions[:, -1:].expand(1, pad)], dim=1)
        mask = static_verification_mask(inner.cpu(), context, bucket, self.capacity).to(device)
        self.set_length(context)
        with compile_settings(self.inductor_settings):
            logits, states = self._compiled(ids, positions, mask)
        self.calls += 1
        if self.copy_outputs:
            logits, states = logits.clone(), tuple(s.clone() for s in states)
        return SimpleNamespace(logits=logits[:, :n], hidden_states=dict(zip(self.hidden_layers, (s[:, :n] for s in states))))

    def warm_up(self, repeats: int = 3) -> None:
        """Compile every bucket and time it (median of ``repeats`` after the compile), at a context
        of a quarter of the capacity; the cache is left empty."""
        from .gqa_attention import masked_gqa

        t0 = time.perf_counter()
        device = self.target.device
        vocab = self.target.config.get_text_config().vocab_size
        context = min(self.capacity // 4, self.capacity - self.buckets[-1])
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad(), masked_gqa(self.target):
            self.prefill(torch.randint(0, vocab, (1, context), generator=gen).to(device))
            times: dict[int, list[float]] = {b: [] for b in self.buckets}
            for r in range(repeats + 1):
                for b in self.buckets:
                    ids = torch.randint(0, vocab, (1, b), generator=gen).to(device)
                    positions = torch.arange(context, context + b, device=device)[None]
                    inner = torch.ones(b, b, dtype=torch.bool).tril()
                    t1 = time.perf_counter()
                    self.verify(ids, positions, inner, context)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    if r > 0:
                        times[b].append(time.perf_counter() - t1)
        self.seconds = {b: sorted(v)[len(v) // 2] for b, v in times.items()}
        self.set_length(0)
        self.calls = 0
        self.warmup_s = time.perf_counter() - t0

    def profile(self, max_tokens: int) -> tuple[list[int], list[float]]:
        """The round policy's cost profile: for every width 1..``max_tokens``, the measured seconds of
        the bucket it runs in."""
        sizes = list(range(1, max_tokens + 1))
        return sizes, [self.seconds[bucket_for(n, self.buckets, self.seconds)] for n in sizes]


RUNNERS_ATTRIBUTE = "_jetspec_static_targets"  # on the target: its StaticTargets live and go with it


def static_target_for(target, needed: int, max_width: int, hidden_layers: list[int], backend: str = "inductor",
                      buckets: tuple[int, ...] | None = None) -> StaticTarget:
    """The target's :class:`StaticTarget` for a call of up to ``needed`` positions and forwards of up to
    ``max_width`` tokens, built and warmed up on first use and kept for the process."""
    buckets = tuple(buckets) if buckets else default_buckets(max_width)
    if max(buckets) < max_width:
        raise ValueError(f"compile_buckets {buckets} do not hold a {max_width}-token verification")
    key = (tuple(hidden_layers), buckets, backend, str(target.dtype), str(target.device))
    runners = target.__dict__.setdefault(RUNNERS_ATTRIBUTE, {})
    runner = runners.get(key)
    if runner is None or runner.capacity < needed + max(buckets):
        runner = StaticTarget(target, capacity_for(needed + max(buckets)), buckets, hidden_layers, backend)
        runner.warm_up()
        runners[key] = runner
    return runner


@torch.no_grad()
def static_greedy(target, input_ids: torch.Tensor, max_new_tokens: int, eos_token_ids=(), backend: str = "inductor",
                  buckets: tuple[int, ...] = (1, 8)) -> torch.Tensor:
    """Plain greedy decoding, one token a step, through a :class:`StaticTarget` (the compiled forward
    compiled rounds verify with: frozen weights on CPU, each step in the cheapest measured bucket).
    Returns ``input_ids`` [1, n] with the new tokens, stopping after an ``eos_token_ids`` token.

    A reference for what compilation alone gives plain decoding on this machine; it takes no logits
    processors or sampling (``generate`` with a static cache and a ``CompileConfig`` is the general path)."""
    from .gqa_attention import masked_gqa

    if input_ids.shape[0] != 1:
        raise ValueError("static_greedy decodes one sequence (batch size 1)")
    eos = set(int(t) for t in eos_token_ids)
    with masked_gqa(target):
        runner = static_target_for(target, input_ids.shape[1] + max_new_tokens, 1, [], backend, buckets)
        out = runner.prefill(input_ids)
        tokens = [int(out.logits[0, -1].argmax())]
        one = torch.ones(1, 1, dtype=torch.bool)
        while len(tokens) < max_new_tokens and tokens[-1] not in eos:
            position = input_ids.shape[1] + len(tokens) - 1
            ids = torch.tensor([[tokens[-1]]], device=input_ids.device)
            out = runner.verify(ids, torch.tensor([[position]], device=input_ids.device), one, position)
            tokens.append(int(out.logits[0, -1].argmax()))
    return torch.cat([input_ids, torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)], dim=1)
