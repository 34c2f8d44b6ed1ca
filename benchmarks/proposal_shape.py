"""Which proposal accepts more under sampling: the drafter's argmax (a point mass) or a draw from q.

    python benchmarks/proposal_shape.py --output benchmarks/results/proposal_shape_smollm2.json

Under sampling a point-mass draft ``d`` is accepted with the target's probability ``p(d)``, a draft
drawn from ``q`` with ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``. Both are computed exactly here, per
draft position, with no sampling noise from the verifier: the target samples a continuation of
each held-out prompt (plain decoding at the temperature), one teacher-forced target forward gives
``p`` at every position (through the same temperature / top-p processors), and at every anchor of
the continuation the drafter drafts a block as ``generate`` does (J0 on noise from the verified
context, then its Jacobi passes over argmax tokens) against a cache of the true verified states.
``q`` is the final pass's distribution through the same processors, with its logits first scaled
by each ``--sharpness`` ``a`` (``q_a ~ exp(a * logits / T)``: 1 is the drafter's own ``q``, larger
is sharper, ``inf`` the point mass). Position ``k`` of the block is scored against the target's
``p`` after the true tokens before it, which have the target's law as accepted drafts do.

Reported per set, temperature and sharpness: the mean acceptance of positions 1..K, and the mean
over anchors of ``sum_k prod_{j<=k} a_j`` (the expected accepted run of the block's first K positions
if positions were accepted independently: a proxy for tau - 1).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch


def acceptance_rows(p: torch.Tensor, draft_logits: torch.Tensor, processors, sharpness: float) -> torch.Tensor:
    """Acceptance per row [K] of drafts from ``draft_logits`` [K, V] against the target's processed
    law ``p`` [K, V]: ``p(argmax)`` for ``sharpness = inf``, else ``sum min(p, q_a)``."""
    if math.isinf(sharpness):
        return p.gather(-1, draft_logits.argmax(-1, keepdim=True)).squeeze(-1)
    q = torch.softmax(processors(torch.zeros(1, 1, dtype=torch.long), sharpness * draft_logits), dim=-1)  # the warpers read no ids
    return torch.minimum(p, q).sum(-1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default=None, help="drafter folder (default: the target's shipped drafter)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--sets", default="mt-bench:40,gsm8k:200,humaneval:100", help="SET:OFFSET, held out from the bench's prompts")
    parser.add_argument("--limit", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--sharpness", default="0.75,1,1.25,1.5,2,3,inf")
    parser.add_argument("--positions", type=int, default=4)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    from hf_jetspec.tools.bench import build_items
    from hf_jetspec.tools.environment import describe_environment
    from hf_jetspec.data import load_eval_prompts
    from hf_jetspec.drafter.jacobi import initial_block_inputs, jacobi_refine, sample_noise_tokens
    from hf_jetspec.generation.sampled_drafting import full_vocab_logits
    from hf_jetspec.tools.targets import load_drafter_for, load_target

    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    drafter.attach_target(target)
    opts = drafter.drafting_config
    gamma, K = opts.budget - 1, args.positions
    layer_ids = list(drafter.config.target_layer_ids)
    vocab = target.get_output_embeddings().weight.shape[0]
    draft_vocab = drafter.draft_vocab_ids
    sharp = [float(s) for s in args.sharpness.split(",")]
    result = {"command": "python benchmarks/proposal_shape.py " + " ".join(argv or __import__("sys").argv[1:]),
              "target": args.target, "drafter": what, "dtype": str(target.dtype).replace("torch.", ""), "top_p": args.top_p,
              "budget": opts.budget, "num_jacobi_passes": opts.num_jacobi_passes, "positions": K,
              "environment": describe_environment(target.device), "rows": []}
    for spec in args.sets.split(","):
        name, offset = spec.split(":")
        items = build_items(tokenizer, target, load_eval_prompts(name, limit=args.limit, offset=int(offset)), args.max_new_tokens)
        if not items:
            raise SystemExit(f"{name} has no prompts after offset {offset}")
        for temperature in [float(t) for t in args.temperatures.split(",")]:
            processors = LogitsProcessorList([TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(args.top_p)] if args.top_p < 1 else []))
            t0 = time.perf_counter()
            per = {s: [] for s in sharp}  # per sharpness: [anchors, K] acceptance
            for i, (_, ids) in enumerate(items):
                torch.manual_seed(1000 + i)
                with torch.no_grad():
                    seq = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature,
                                          top_p=args.top_p, top_k=0, max_new_tokens=args.max_new_tokens)
                    out = target(seq, output_hidden_states=True)
                n, length = ids.shape[1], seq.shape[1]
                p_all = torch.softmax(processors(seq, out.logits[0].float()), dim=-1)  # temperature / top-p read no ids
                states = [out.hidden_states[j + 1] for j in layer_ids]
                cache = drafter.new_cache()
                drafter.append_context(cache, [s[:, : n - 1] for s in states], torch.arange(n - 1), window=opts.context_window)
                gen = torch.Generator().manual_seed(0)
                for t in range(n - 1, length - K):  # the anchor: the token at t; the cache holds positions < t
                    anchor = seq[0, t : t + 1]
                    block = initial_block_inputs(anchor, sample_noise_tokens(seq[0, :t], gamma - 1, gen))
                    with torch.no_grad():
                        draft, logits = drafter.draft_block(cache, block, t, return_logits=True)
                        last = {"logits": logits}

                        def draft_fn(inputs, t=t, last=last):
                            new, last["logits"] = drafter.draft_block(cache, inputs, t, return_logits=True)
                            return new

                        jacobi_refine(draft_fn, anchor, draft, opts.num_jacobi_passes)
                    rows = full_vocab_logits(last["logits"][:K], draft_vocab, vocab)
                    p = p_all[t : t + K]  # the target's law of the tokens at t+1 .. t+K
                    for s in sharp:
                        per[s].append(acceptance_rows(p, rows, processors, s))
                    drafter.append_context(cache, [s_[:, t : t + 1] for s_ in states], torch.arange(t, t + 1), window=opts.context_window)
            for s in sharp:
                acc = torch.stack(per[s])  # [anchors, K]
                run = torch.cumprod(acc, dim=-1).sum(-1).mean()
                row = {"set": name, "temperature": temperature, "sharpness": "inf (point mass)" if math.isinf(s) else s,
                       "anchors": acc.shape[0], "acceptance_by_position": [round(float(v), 4) for v in acc.mean(0)],
                       "expected_run": round(float(run), 4)}
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
            print(f"{name} T={temperature}: {time.perf_counter() - t0:.0f} s", flush=True)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
