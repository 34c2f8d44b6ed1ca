"""What a verification forward costs eagerly on a dynamic cache and compiled on a static one, by width.

    python benchmarks/static_rounds_cost.py --target smollm2-135m --dtype bfloat16 \
        --output benchmarks/results/static_rounds_cost_smollm2.json

For each width (``--widths``) the median of ``--repeats`` forwards over a ``--context``-token cache,
the widths interleaved so that machine noise hits each alike:

- **eager, dynamic cache**: the forward the eager rounds run (the read layers' states returned);
- **compiled, static cache**: the same rows through a :class:`~hf_jetspec.generation.static_rounds.StaticTarget`
  (its compile time reported apart), each width in its own bucket, under the tree mask's padding rules.

The compiled rounds' warm-up measures the same buckets at a context of a quarter of the cache's capacity.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from hf_jetspec import load_target
from hf_jetspec.generation.gqa_attention import masked_gqa
from hf_jetspec.generation.static_rounds import StaticTarget, capacity_for
from hf_jetspec.tools.environment import describe_environment


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--widths", default="1,8,16,32")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    from transformers import DynamicCache

    target, _ = load_target(args.target, dtype=args.dtype)
    widths = [int(w) for w in args.widths.split(",")]
    layers = [target.config.num_hidden_layers // 2, target.config.num_hidden_layers]
    vocab = target.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, args.context), generator=gen).to(target.device)
    runner = StaticTarget(target, capacity_for(args.context + max(widths)), tuple(widths), layers)
    dynamic = DynamicCache(config=target.config)
    compile_s = {}
    times = {(kind, w): [] for kind in ("eager", "compiled") for w in widths}
    with torch.no_grad(), masked_gqa(target):
        target(input_ids=prompt, cache=dynamic, use_cache=True)
        runner.prefill(prompt)

        def run(kind, w):
            ids = torch.randint(0, vocab, (1, w), generator=gen).to(target.device)
            positions = torch.arange(args.context, args.context + w, device=target.device)[None]
            inner = torch.ones(w, w, dtype=torch.bool).tril()
            t0 = time.perf_counter()
            if kind == "eager":
                mask = torch.cat([torch.ones(w, args.context, dtype=torch.bool), inner], dim=1)[None, None]
                target(input_ids=ids, position_ids=positions, attention_mask=mask, cache=dynamic, use_cache=True,
                       output_hidden_states=True)
                seconds = time.perf_counter() - t0
                dynamic.crop(-w)
            else:
                runner.verify(ids, positions, inner, args.context)
                seconds = time.perf_counter() - t0
            return seconds

        for w in widths:
            t0 = time.perf_counter()
            run("compiled", w)
            compile_s[w] = round(time.perf_counter() - t0, 1)
            run("eager", w)
        for _ in range(args.repeats):
            for w in widths:
                for kind in ("eager", "compiled"):
                    times[kind, w].append(run(kind, w))
    rows = []
    for w in widths:
        eager = sorted(times["eager", w])[args.repeats // 2] * 1000
        compiled = sorted(times["compiled", w])[args.repeats // 2] * 1000
        rows.append({"width": w, "eager_dynamic_ms": round(eager, 2), "compiled_static_ms": round(compiled, 2),
                     "ratio": round(eager / compiled, 3), "compile_s": compile_s[w]})
        print(f"{w:>3} tokens: eager {eager:6.1f} ms, compiled {compiled:6.1f} ms ({eager / compiled:.2f}x), compile {compile_s[w]} s")
    result = {"command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]), "target": args.target,
              "dtype": args.dtype, "context": args.context, "repeats": args.repeats, "capacity": runner.capacity, "rows": rows,
              "graphs": runner.compiles, "environment": describe_environment(target.device)}
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
