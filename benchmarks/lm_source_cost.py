"""What an LM proposal source costs per token, and what each cheaper option costs in agreement.

    python benchmarks/lm_source_cost.py --target qwen2.5-coder-1.5b --lm qwen2.5-coder-0.5b --prompts humaneval --limit 4 \
        --output benchmarks/results/lm_source_cost_qwen.json

For each option of :class:`~hf_jetspec.assistant.LMSourceConfig` (``float-*``: the LM in ``--dtype``;
``fp32-*``: the LM in float32; ``int8-*``: int8 products; ``*-full``: the whole head, ``*-32k`` / ``*-16k``: a restricted one) and for
the target itself:

- **ms per token**: the median of single-token forwards (restricted head included) over a cache of
  the prompt plus 128 tokens, fed one at a time, interleaved between options;
- **agreement**: along the target's own greedy answers (``--new`` tokens per prompt), the share of
  positions where the option's argmax equals the target's token (teacher-forced, one forward per
  answer). It is the acceptance rate of a one-token LM chain, and bounds what longer chains reach.

The restricted head keeps the target drafter's draft vocabulary first, as ``attach_lm_source`` does.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_jetspec import load_target
from hf_jetspec.assistant import LMSource, LMSourceConfig
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.data import prompt_input_ids
from hf_jetspec.tools.environment import describe_environment
from hf_jetspec.tools.targets import load_drafter_for

OPTIONS = {
    "float-full": LMSourceConfig(head_vocab=None, int8=False),
    "float-32k": LMSourceConfig(head_vocab=32768, int8=False),
    "float-16k": LMSourceConfig(head_vocab=16384, int8=False),
    "fp32-32k": LMSourceConfig(head_vocab=32768, int8=False),
    "int8-full": LMSourceConfig(head_vocab=None, int8=True),
    "int8-32k": LMSourceConfig(head_vocab=32768, int8=True),
    "int8-16k": LMSourceConfig(head_vocab=16384, int8=True),
}


def time_tokens(source: LMSource, prompt: list[int], steps: int) -> list[float]:
    """Seconds of ``steps`` single-token forwards after the prompt (its own greedy tokens fed back)."""
    source.reset()
    chain = source.propose(prompt, 1)
    token, out = chain.tokens[0], []
    for _ in range(steps):
        t0 = time.perf_counter()
        p = source._step([token])
        out.append(time.perf_counter() - t0)
        row = int(p.argmax())
        token = row if source.head_ids is None else int(source.head_ids[row])
    return out


@torch.no_grad()
def agreement(source: LMSource, sequence: torch.Tensor, start: int) -> tuple[int, int]:
    """(agreeing positions, positions) of ``source``'s argmax against ``sequence[start:]``."""
    source.reset()
    out = source.backbone(input_ids=sequence[None].to(source.device))
    logits = source.head(out.last_hidden_state[0, start - 1 : -1])
    rows = logits.argmax(-1)
    ids = rows if source.head_ids is None else source.head_ids[rows]
    truth = sequence[start:].to(ids.device)
    return int((ids == truth).sum()), int(truth.numel())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--lm", default="qwen2.5-coder-0.5b")
    ap.add_argument("--prompts", default="humaneval")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--options", default="float-full,float-32k,fp32-32k,int8-full,int8-32k,int8-16k")
    ap.add_argument("--output")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, _ = load_drafter_for(target, args.target, None)
    preferred = drafter.draft_vocab_ids
    prompts = load_eval_prompts(args.prompts, limit=args.limit, tokenizer=tokenizer)
    sequences = []
    for p in prompts:
        ids = prompt_input_ids(tokenizer, p, [{"role": "user", "content": p.turns[0]}])
        out = target.generate(ids, do_sample=False, max_new_tokens=args.new, temperature=None, top_k=None, top_p=None)
        sequences.append((out[0], ids.shape[1]))
    sources = {"target (plain step)": LMSource(target, LMSourceConfig(head_vocab=None))}
    lm, _ = load_target(args.lm, dtype=args.dtype)
    for name in args.options.split(","):  # each option on its own copy: int8 repacks the copy's linears
        model = copy.deepcopy(lm).float() if name.startswith("fp32-") else copy.deepcopy(lm)
        sources[name] = LMSource(model, OPTIONS[name], preferred_ids=preferred)
    times = {name: [] for name in sources}
    for seq, start in sequences:
        prompt = seq[: start + 1].tolist()
        for name, source in sources.items():  # interleaved, prompt by prompt
            times[name] += time_tokens(source, prompt, args.steps)
    rows = {}
    for name, source in sources.items():
        agree = [agreement(source, seq, start) for seq, start in sequences]
        hits, total = sum(a for a, _ in agree), sum(n for _, n in agree)
        rows[name] = {"ms_per_token": round(1000 * statistics.median(times[name]), 2), "agreement": round(hits / total, 4),
                      "head_rows": None if source.head_ids is None else int(source.head_ids.numel()), "int8": source.config.int8}
        print(f"{name:22s} {rows[name]['ms_per_token']:8.2f} ms/token  agreement {rows[name]['agreement']:.3f}", flush=True)
    result = {"command": "python benchmarks/lm_source_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "target": args.target, "lm": args.lm, "prompts": args.prompts, "limit": args.limit, "new_tokens": args.new,
              "dtype": args.dtype, "environment": describe_environment(target.device), "options": rows}
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
