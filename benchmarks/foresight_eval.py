"""Foresight drafting on held-out prompts: adapter quality, live hit rate, refresh gain, replay, exposed time.

    python benchmarks/foresight_eval.py --prompts gsm8k --limit 10 --max-new-tokens 128 \
        --calibration-records benchmarks/results/foresight_calibration_rounds.jsonl \
        --output benchmarks/results/foresight_smollm2_gsm8k.json

Uses the drafter and foresight adapter shipped for the target unless --drafter / --adapter are
given (the adapter folder must hold foresight_calibration.json from `hf-jetspec calibrate`, fitted
on other prompts). Every generation is checked token for token against the target's greedy output.
Timings are interleaved per prompt; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hf_jetspec import load_target
from hf_jetspec.tools.bench import build_items
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.foresight.calibrate import load_records, save_records
from hf_jetspec.foresight.decoder import ForesightDecoder
from hf_jetspec.training.losses import gap_recovered
from hf_jetspec.foresight.replay import fit_fanout, replay_hit_rates
from hf_jetspec.tools.targets import companion_adapter_path, load_drafter_for
from hf_jetspec.assistant import assistant_for


def adapter_quality(target, drafter, adapter, sequences, block: int) -> dict:
    """Gap recovered by the adapter, and top-1 agreement of the decoder on predicted vs true states.

    Blocks of the target's own greedy continuation are predicted through the serving path
    (``append_context`` + ``predict``), for a trained or a layer-skip adapter alike.
    """
    layer_ids = drafter.config.target_layer_ids
    decoder = ForesightDecoder(target, max(layer_ids))
    preds, trues, copies, agree_pred, agree_true, n = [], [], [], 0, 0, 0
    for seq, start in sequences:
        with torch.no_grad():
            out = target(seq, output_hidden_states=True)
        states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], -1)
        greedy = out.logits[0].argmax(-1)
        h = drafter.config.target_hidden_size
        for a in range(start, seq.shape[1] - block, block):
            cache = adapter.new_cache()
            adapter.append_context(cache, states[:, :a], torch.arange(a), layer_inputs=[out.hidden_states[i][:, :a] for i in adapter.state_indices])
            pred = adapter.predict(cache, seq[:, a : a + block], torch.tensor([a]))
            true = states[:, a : a + block]
            preds.append(pred[0])
            trues.append(true[0])
            copies.append(states[0, a - 1][None].expand_as(true[0]))
            dcache = decoder.new_cache()
            decoder.append_context(dcache, [out.hidden_states[i][:, :a] for i in decoder.state_indices], torch.arange(a))
            lp = decoder.logits(dcache, pred[..., -h:], torch.tensor([a]))[0].argmax(-1)
            lt = decoder.logits(dcache, true[..., -h:], torch.tensor([a]))[0].argmax(-1)
            agree_pred += int((lp == greedy[a : a + block]).sum())
            agree_true += int((lt == greedy[a : a + block]).sum())
            n += block
    pred, true, copy = torch.cat(preds), torch.cat(trues), torch.cat(copies)
    h = drafter.config.target_hidden_size
    per_layer = {str(lid): gap_recovered(pred[..., i * h : (i + 1) * h], true[..., i * h : (i + 1) * h], copy[..., i * h : (i + 1) * h])
                 for i, lid in enumerate(layer_ids)}
    return {
        "gap_recovered": gap_recovered(pred, true, copy),
        "gap_recovered_per_layer": per_layer,
        "decoder_top1_agreement_predicted_states": agree_pred / n,
        "decoder_top1_agreement_true_states": agree_true / n,
        "blocks": len(preds),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None)
    ap.add_argument("--adapter", default=None)
    ap.add_argument("--prompts", default="gsm8k")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--cache-size", type=int, default=4)
    ap.add_argument("--calibration-records", default=None, help="JSONL from `hf-jetspec calibrate --records` (fits SSD's fan-out)")
    ap.add_argument("--records-output", default=None, help="save this run's recorded rounds (JSONL)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the pipelined row then uses a background CUDA stream)")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()

    torch.manual_seed(0)
    target, tok = load_target(args.target, device=args.device)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    adapter_path = args.adapter or companion_adapter_path(args.target)
    assistant_for(drafter).attach_foresight(str(adapter_path))
    adapter, calibration = assistant_for(drafter).foresight
    if calibration is None:
        raise SystemExit(f"{adapter_path} has no foresight_calibration.json: run `hf-jetspec calibrate` first")
    base = drafter.drafting_config.replace(budget=args.budget, num_jacobi_passes=1, cache_size=args.cache_size, pipeline="off",
                                           foresight=False, num_context_refreshes=0, record_rounds=False)
    items = build_items(tok, target, load_eval_prompts(args.prompts, limit=args.limit, offset=args.offset), args.max_new_tokens)
    items = [(item_id, ids.to(target.device)) for item_id, ids in items]
    pipelined = "stream" if target.device.type == "cuda" else "thread"

    configs = {
        "J1-R0": base,
        "J1-R1": base.replace(num_context_refreshes=1),
        "J2-R2": base.replace(num_jacobi_passes=2, num_context_refreshes=2),
        "foresight-J1-off": base.replace(foresight=True, record_rounds=True),
        f"foresight-J1-{pipelined}": base.replace(foresight=True, pipeline=pipelined),
    }
    gen = dict(do_sample=False, max_new_tokens=args.max_new_tokens, temperature=None, top_k=None, top_p=None)
    for name, cfg in configs.items():  # warm-up of every path, untimed
        drafter.drafting_config = cfg
        target.generate(items[0][1], attention_mask=torch.ones_like(items[0][1]), assistant_model=drafter, **{**gen, "max_new_tokens": 16})

    acc = {name: {"seconds": 0.0, "tokens": 0, "rounds": 0, "committed": 0, "draft_s": 0.0, "background_s": 0.0,
                  "lookups": 0, "hits": 0, "refreshes": 0, "replacements": 0, "exact": 0, "failures": 0} for name in ["ar", *configs]}
    records, sequences = [], []
    for i, (item_id, ids) in enumerate(items):
        mask = torch.ones_like(ids)
        names = ["ar", *configs]
        order = names[i % len(names) :] + names[: i % len(names)]
        outs = {}
        for name in order:
            kwargs = {} if name == "ar" else {"assistant_model": drafter}
            if name != "ar":
                drafter.drafting_config = configs[name]
            t0 = time.perf_counter()
            with torch.no_grad():
                out = target.generate(ids, attention_mask=mask, **gen, **kwargs)
            dt = time.perf_counter() - t0
            outs[name] = out
            a = acc[name]
            a["seconds"] += dt
            a["tokens"] += out.shape[1] - ids.shape[1]
            if name != "ar":
                s = drafter.generation_stats
                a["rounds"] += s.rounds
                a["committed"] += s.committed_tokens
                a["draft_s"] += s.draft_time_s
                a["background_s"] += s.background_time_s
                a["lookups"] += s.cache_lookups
                a["hits"] += s.cache_hits
                a["refreshes"] += s.refreshes
                a["replacements"] += s.anchor_replacements
                a["failures"] += s.worker_failures
                if name == "foresight-J1-off":
                    records.extend(s.foresight_records)
        for name in configs:
            acc[name]["exact"] += int(torch.equal(outs[name], outs["ar"]))
        acc["ar"]["exact"] += 1
        sequences.append((outs["ar"], ids.shape[1]))
        print(item_id, {n: round(acc[n]["committed"] / max(1, acc[n]["rounds"]), 2) for n in configs}, flush=True)

    ar_tps = acc["ar"]["tokens"] / acc["ar"]["seconds"]
    rows = {}
    for name, a in acc.items():
        tps = a["tokens"] / a["seconds"]
        rows[name] = {
            "tokens_per_s": tps,
            "speedup_vs_ar": tps / ar_tps,
            "tau": a["committed"] / a["rounds"] if a["rounds"] else None,
            "exact_match_vs_ar": a["exact"] / len(items),
            "rounds": a["rounds"],
            "exposed_draft_ms_per_round": 1000 * a["draft_s"] / a["rounds"] if a["rounds"] else None,
            "background_draft_ms_per_round": 1000 * a["background_s"] / a["rounds"] if a["rounds"] else None,
            "hit_rate": a["hits"] / a["lookups"] if a["lookups"] else None,
            "context_refreshes": a["refreshes"],
            "anchor_replacements": a["replacements"],
            "worker_failures": a["failures"],
        }
    cal_records = load_records(args.calibration_records) if args.calibration_records else records
    fanout = fit_fanout(cal_records)
    replay = replay_hit_rates(records, calibration, cache_sizes=(1, 2, 4, 8, 16), fanout=fanout)
    quality = adapter_quality(target, drafter, adapter, sequences, args.budget)
    result = {
        "methods": rows,
        "replay_hit_rate": replay,
        "fanout_fit": {"alpha": fanout.alpha, "rho": fanout.rho, "fitted_on": args.calibration_records or "these rounds"},
        "adapter_quality": quality,
        "calibration": {"weights": calibration.weights, "beta": calibration.beta, "threshold": calibration.threshold, "num_rounds": calibration.num_rounds},
        "config": vars(args) | {"drafter_used": what, "adapter_used": str(adapter_path), "items": [i for i, _ in items]},
        "environment": describe_environment(target.device),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    if args.records_output:
        save_records(records, args.records_output)
    print(json.dumps({k: result[k] for k in ("methods", "replay_hit_rate", "adapter_quality")}, indent=1))


if __name__ == "__main__":
    main()
