"""Probes of what a drafter pass costs on this CPU (bf16): where a warm pass goes, the draft head's size,
int8 weights, and the small reductions and attention calls the engine chose between.

    python benchmarks/drafter_pass_probes.py --output benchmarks/results/drafter_pass_probes.json

1. ``head_size``: J1 drafting (two passes) with the shipped 8,192-token draft head against the same
   drafter restricted to the 4,096 of those tokens most frequent in ShareGPT answers, each timed
   right after an untimed target step, interleaved with a plain step (median of 30).
2. ``int8_matmul``: ``F.linear`` in bf16 against ``torch._weight_int8pack_mm`` (weight-only int8,
   per-channel scales) on the drafter's shapes for 15 rows, warm (mean of 300 calls).
3. ``warm_pass``: one warm drafting pass (15 rows, 300-row context) under the torch profiler: total
   time per pass and the share in matrix multiplies.
4. ``ops_us``: the engine's choices, each warm (mean of 300 calls): bf16 ``argmax`` against
   ``max(-1)`` on [15, 8,192]; SDPA over 300 context + 15 block rows with repeated keys and a
   contiguous mask against ``enable_gqa`` on cache views; and the decoder's logsumexp over
   [16, 49,152] bf16 three ways, with each one's largest error against float64.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def head_size(drafter_path: str) -> dict:
    from transformers import DynamicCache

    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.tools.data import frequent_response_tokens

    target, tok = load_target("smollm2-135m", dtype="bfloat16")
    full = JetSpecDrafter.from_pretrained(drafter_path)
    full.attach_target(target)
    small = JetSpecDrafter.from_pretrained(drafter_path)
    small.attach_target(target)
    keep = set(full.draft_vocab.tolist())
    small.restrict_draft_vocab([t for t in frequent_response_tokens(tok, 6000) if t in keep][:4096])
    ids = torch.randint(0, target.config.vocab_size, (1, 301), generator=torch.Generator().manual_seed(0))
    out = target(ids[:, :300], output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in full.config.target_layer_ids], -1)
    drafters = {}
    for d in (full, small):
        cache = d.new_cache()
        d.append_context(cache, states, torch.arange(300))
        drafters[str(d.config.draft_vocab_size)] = (d, cache)
    kv = DynamicCache(config=target.config)
    target(input_ids=ids[:, :300], cache=kv, use_cache=True)

    def step():
        extra = kv.get_seq_length() - 300
        if extra > 0:
            kv.crop(-extra)
        target(input_ids=ids[:, 300:301], cache=kv, use_cache=True, position_ids=torch.tensor([[300]]))

    block, anchor = ids[0, 285:300], ids[0, 300:301]

    def j1(d, cache):
        draft = d.draft_block(cache, block, 300)
        return d.draft_block(cache, torch.cat([anchor, draft[:-1]]), 300)

    fns = {"plain_step": step, **{f"J1_head_{k}": (lambda d=d, c=c: j1(d, c)) for k, (d, c) in drafters.items()}}
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples = {k: [] for k in fns}
    for _ in range(30):
        for name, fn in fns.items():
            if name != "plain_step":
                step()
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: round(1000 * statistics.median(v), 2) for k, v in samples.items()}


def _mean_us(fn, n_calls: int = 300) -> float:
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(n_calls):
        fn()
    return round(1e6 * (time.perf_counter() - t0) / n_calls, 1)


def warm_pass(drafter_path: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from hf_jetspec import JetSpecDrafter, load_target

    target, _ = load_target("smollm2-135m", dtype="bfloat16")
    drafter = JetSpecDrafter.from_pretrained(drafter_path)
    drafter.attach_target(target)
    ids = torch.randint(0, target.config.vocab_size, (1, 301), generator=torch.Generator().manual_seed(0))
    out = target(ids[:, :300], output_hidden_states=True)
    cache = drafter.new_cache()
    drafter.append_context(cache, torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1), torch.arange(300))
    block = ids[0, 285:300]
    for _ in range(20):
        drafter.draft_block(cache, block, 300)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            drafter.draft_block(cache, block, 300)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    mm = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    return {"ms_per_pass": round(total / 50 / 1000, 2), "matmul_ms_per_pass": round(mm / 50 / 1000, 2)}


def ops_us() -> dict:
    from hf_jetspec.tools.numerics import log_normaliser

    torch.manual_seed(0)
    x = torch.randn(15, 8192).bfloat16()
    q = torch.randn(1, 9, 15, 64).bfloat16()
    buf = torch.randn(1, 3, 1024, 64).bfloat16()
    k = buf[:, :, :315]
    kc = k.contiguous()
    table = torch.arange(1024 + 15)[None, :] <= (1024 + torch.arange(15)[:, None])
    mask_view = table[:, 1024 - 300 :][None, None]
    mask = mask_view.contiguous()
    logits = (torch.randn(16, 49152) * 4).bfloat16()
    ref = torch.logsumexp(logits.double(), -1)

    def bf16_exp():
        peak = logits.amax(-1, keepdim=True)
        return peak.squeeze(-1).float() + torch.log(torch.exp(logits - peak).sum(-1, dtype=torch.float32))

    lse = {"four_rows_at_a_time": lambda: log_normaliser(logits), "whole_float32_copy": lambda: torch.logsumexp(logits.float(), -1),
           "bf16_exp_float32_sum": bf16_exp}
    return {
        "argmax_bf16": _mean_us(lambda: x.argmax(-1)),
        "max_dim_bf16": _mean_us(lambda: x.max(-1)),
        "sdpa_repeat_interleave_contiguous_mask": _mean_us(
            lambda: F.scaled_dot_product_attention(q, kc.repeat_interleave(3, 1), kc.repeat_interleave(3, 1), attn_mask=mask)),
        "sdpa_enable_gqa_views": _mean_us(lambda: F.scaled_dot_product_attention(q, k, k, attn_mask=mask_view, enable_gqa=True)),
        "logsumexp_16x49152": {name: {"us": _mean_us(fn, 100), "max_abs_error": float((fn().double() - ref).abs().max())}
                               for name, fn in lse.items()},
    }


def int8_matmul() -> list[dict]:
    torch.manual_seed(0)
    rows = []
    for n, k in [(8192, 576), (1536, 576), (576, 1536), (576, 576)]:
        w = torch.randn(n, k).bfloat16() * 0.02
        x = torch.randn(15, k).bfloat16()
        scale = w.float().abs().amax(1) / 127
        q = torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
        s = scale.bfloat16()

        def timed(fn, n_calls=300):
            for _ in range(20):
                fn()
            t0 = time.perf_counter()
            for _ in range(n_calls):
                fn()
            return 1e6 * (time.perf_counter() - t0) / n_calls

        rows.append({"out": n, "in": k, "bf16_us": round(timed(lambda: F.linear(x, w)), 1),
                     "int8_us": round(timed(lambda: torch._weight_int8pack_mm(x, q, s)), 1)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="hub_cards/jetspec-smollm2-135m")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    result = {"head_size_ms": head_size(args.drafter), "int8_matmul": int8_matmul(), "warm_pass": warm_pass(args.drafter),
              "ops_us": ops_us()}
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
