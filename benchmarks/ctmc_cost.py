"""SpecCTMC cost study: when does speculative sampling of a masked denoiser's CTMC pay?

Target: AntiBERTy (8-layer protein masked LM). Drafts: the same model truncated to its first
layers. For each draft length k the study measures, on this machine, the cost c(k) of a k-row
target call relative to a 1-row call, the accepted-prefix distribution, sequential target calls,
evaluated rows and wall-clock time against the reference sampler, on the same number of samples.

    python benchmarks/ctmc_cost.py --length 64 --samples 3 --output benchmarks/results/ctmc_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from hf_jetspec.ctmc import antiberty_denoiser, load_antiberty, sample, speculative_sample, truncated_masked_lm


def time_call(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--draft-lengths", default="1,2,4,8")
    ap.add_argument("--draft-layers", default="1,2,4", help="truncations to screen; the cost study uses the best")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model, tok = load_antiberty()
    target = antiberty_denoiser(model, tok)
    mask = tok.mask_token_id
    L = args.length
    ks = [int(k) for k in args.draft_lengths.split(",")]

    # c(k): cost of a k-row call relative to a 1-row call, on half-masked states
    g = torch.Generator().manual_seed(1)
    state = torch.randint(5, 25, (max(ks + [16]), L), generator=g)
    state[torch.rand(state.shape, generator=g) < 0.5] = mask
    t = torch.full((state.shape[0],), 0.5)
    one = time_call(lambda: target(state[:1], t[:1]), args.repeats)
    cost = {k: time_call(lambda k=k: target(state[:k], t[:k]), args.repeats) / one for k in sorted(set(ks + [16]))}

    # screen drafts: per-row cost and acceptance at k = 4
    screen = {}
    for layers in [int(x) for x in args.draft_layers.split(",")]:
        draft = antiberty_denoiser(truncated_masked_lm(model, layers), tok)
        d_one = time_call(lambda: draft(state[:1], t[:1]), args.repeats)
        _, st = speculative_sample(target, draft, L, 1, mask_id=mask, draft_length=4, generator=torch.Generator().manual_seed(5))
        screen[layers] = {"row_cost_vs_target": d_one / one, "acceptance_rate": st.acceptance_rate}
    best = max(screen, key=lambda n: screen[n]["acceptance_rate"] / (1 + 4 * screen[n]["row_cost_vs_target"]))
    draft = antiberty_denoiser(truncated_masked_lm(model, best), tok)

    # reference vs speculative, same samples count, one sample at a time (batch size 1 both)
    ref_times, ref_calls = [], 0
    for s in range(args.samples):
        t0 = time.perf_counter()
        _, st = sample(target, L, 1, mask_id=mask, generator=torch.Generator().manual_seed(100 + s), return_stats=True)
        ref_times.append(time.perf_counter() - t0)
        ref_calls += st.target_calls
    rows = []
    for k in ks:
        times, agg = [], None
        for s in range(args.samples):
            t0 = time.perf_counter()
            _, st = speculative_sample(target, draft, L, 1, mask_id=mask, draft_length=k, generator=torch.Generator().manual_seed(200 + s))
            times.append(time.perf_counter() - t0)
            agg = st if agg is None else agg.merge(st)
        hist = agg.accepted_prefix_hist + [0] * (k + 1 - len(agg.accepted_prefix_hist))
        rows.append({
            "draft_length": k,
            "c_k": cost[k],
            "accepted_prefix_dist": [h / agg.rounds for h in hist],
            "acceptance_rate": agg.acceptance_rate,
            "events_per_round": agg.events / agg.rounds,
            "sequential_target_calls_per_sample": agg.target_calls / args.samples,
            "draft_calls_per_sample": agg.draft_calls / args.samples,
            "evaluated_rows_per_sample": agg.evaluated_rows / args.samples,
            "wall_s_per_sample": statistics.mean(times),
            "speed_vs_reference": statistics.mean(ref_times) / statistics.mean(times),
            "call_reduction_vs_reference": (ref_calls / args.samples) / (agg.target_calls / args.samples),
            # predicted target time per event in 1-row-call units: c(k) * rounds / events
            "target_time_per_event": cost[k] * agg.rounds / agg.events,
        })
    result = {
        "config": vars(args) | {"draft_layers_used": best},
        "environment": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(), "device": "cpu"},
        "c_k": cost,
        "one_row_call_s": one,
        "draft_screen": screen,
        "reference": {"wall_s_per_sample": statistics.mean(ref_times), "sequential_target_calls_per_sample": ref_calls / args.samples},
        "speculative": rows,
    }
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2)
    print(f"1-row target call {one * 1e3:.1f} ms; c(k): " + ", ".join(f"c({k})={v:.2f}" for k, v in cost.items()))
    print("draft screen: " + "; ".join(f"{n} layers: row cost {v['row_cost_vs_target']:.2f}, acceptance {v['acceptance_rate']:.2f}" for n, v in screen.items()) + f" -> using {best}")
    print(f"reference: {result['reference']['wall_s_per_sample']:.2f} s/sample, {ref_calls / args.samples:.0f} calls")
    print("| k | c(k) | accept rate | events/round | target calls | rows | draft calls | s/sample | speed vs ref |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['draft_length']} | {r['c_k']:.2f} | {r['acceptance_rate']:.2f} | {r['events_per_round']:.2f} | {r['sequential_target_calls_per_sample']:.1f} | {r['evaluated_rows_per_sample']:.1f} | {r['draft_calls_per_sample']:.1f} | {r['wall_s_per_sample']:.2f} | {r['speed_vs_reference']:.2f}x |")


if __name__ == "__main__":
    main()
