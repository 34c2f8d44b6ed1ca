"""Where the time of a round goes, by context length: plain, n-gram and drafter rounds against
transformers' own plain greedy step at the same context.

    python benchmarks/round_profile.py --output benchmarks/results/round_profile_smollm2.json
    # the same on an older checkout (which has no hf_jetspec.data.long_prompts): save the prompt text first
    python benchmarks/round_profile.py --save-document runs/long_document.txt
    PYTHONPATH=OLD_CHECKOUT/src python benchmarks/round_profile.py --document runs/long_document.txt --output ...

For each dtype and context length, the prompt is a long ShareGPT transcript (the second document
of the ``long-chat`` sets, uncut: about 11k tokens) cut to exactly that many tokens. Then, in one interpreter, taking turns:

- ``hf-plain``: ``target.generate`` greedy, the target's own loop;
- ``plain``: JetSpec with the round policy, the draft gate held shut and n-gram proposals off: every
  round a plain step (what the policy does when nothing pays);
- ``ngram``: the same with n-gram proposals on (the drafter never runs);
- ``drafter``: the gate held open and n-gram proposals off: the drafter runs every round;
- ``jetspec``: the shipped options, untouched.

Each generates ``--steps`` tokens after the prompt. A round's time runs from one call of the
candidate generator to the next (the target's prefill excluded); ``hf-plain``'s step runs from
one decoding forward's start to the next's (the median). ``ms_per_token`` is the whole call after
the prefill forward over the tokens it made, set-up included. Per round (means; ``median_total_ms``
beside them) it is split into

- ``forward_ms``: the target forward (verification, or the plain step), hidden states included;
- ``states_ms``: gathering the new read-layer hidden states;
- ``cache_fill_ms``: projecting verified states into the drafter's cache;
- ``ngram_ms``: the n-gram index update and lookup;
- ``draft_ms``: the drafter passes;
- ``policy_ms``: the rest of the candidate generator (choices, statistics, bookkeeping);
- ``loop_ms``: the rest of transformers' assisted loop (masks, inputs, acceptance, cache crop).

``overhead`` (``median_overhead``) is the mean (median) round over ``hf-plain``'s step at the same
context. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from hf_jetspec.assistant import assistant_for

COMPONENTS = ("forward_ms", "states_ms", "cache_fill_ms", "ngram_ms", "draft_ms", "policy_ms", "loop_ms")


class RoundClock:
    """Per-round component times, collected by wrapping the functions a round calls."""

    def __init__(self):
        self.rounds: list[dict] = []
        self.current: dict | None = None
        self.round_start = 0.0
        self.prefill_forward_s = 0.0
        self.forwards = 0
        self.depth = 0  # nested wrapped calls count once, in the outermost component

    def start_round(self) -> None:
        now = time.perf_counter()
        self.close_round(now)
        self.current = {k: 0.0 for k in COMPONENTS}
        self.round_start = now

    def close_round(self, now: float) -> None:
        if self.current is not None:
            self.current["total_ms"] = 1000 * (now - self.round_start)
            self.rounds.append(self.current)
            self.current = None

    def add(self, component: str, seconds: float) -> None:
        if self.current is not None:
            self.current[component] += 1000 * seconds


@contextmanager
def patched(obj, name, wrapper):
    own = name in vars(obj)  # an instance attribute of its own, or one looked up on its class
    original = getattr(obj, name)
    setattr(obj, name, wrapper(original))
    try:
        yield original
    finally:
        if own or isinstance(obj, type):
            setattr(obj, name, original)
        else:
            delattr(obj, name)


def timed(clock: RoundClock, component: str):
    def wrap(fn):
        def inner(*args, **kwargs):
            if clock.depth:
                return fn(*args, **kwargs)
            clock.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock.depth -= 1
                clock.add(component, time.perf_counter() - t0)

        return inner

    return wrap


def run_profiled(target, ids, generate_kwargs, steps: int, gate=None):
    """Generate ``steps`` tokens with a round clock in every function a round calls; returns
    ``(rounds, round sources, seconds after the prefill, tokens)``."""
    import hf_jetspec.generation.candidate_generator as cg
    import hf_jetspec.policy as policy
    from hf_jetspec.policy import DraftGate, NgramIndex

    clock = RoundClock()
    gen_cls = cg.JetSpecCandidateGenerator

    def forward_wrap(fn):
        def inner(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            dt = time.perf_counter() - t0
            clock.forwards += 1
            if clock.current is None:
                clock.prefill_forward_s += dt
            else:
                clock.add("forward_ms", dt)
            return out

        return inner

    def get_candidates_wrap(fn):
        def inner(self, *args, **kwargs):
            if not kwargs.get("is_first_iteration"):
                clock.start_round()
            t0 = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            finally:
                clock.add("policy_ms", time.perf_counter() - t0)  # the named parts are taken back out below

        return inner

    subtract = ("states_ms", "cache_fill_ms", "ngram_ms", "draft_ms")
    stack = [
        patched(target, "forward", forward_wrap),
        patched(gen_cls, "get_candidates", get_candidates_wrap),
        patched(gen_cls, "update_candidate_strategy", timed(clock, "policy_ms")),
        patched(gen_cls, "_new_context_states", timed(clock, "states_ms")),
        patched(gen_cls, "_flush_context", timed(clock, "cache_fill_ms")),
        patched(gen_cls, "_scored_draft", timed(clock, "draft_ms")),
        patched(gen_cls, "_draft", timed(clock, "draft_ms")),
        patched(NgramIndex, "extend", timed(clock, "ngram_ms")),
        patched(policy, "propose_ngram", timed(clock, "ngram_ms")),
    ]
    if gate is not None:
        stack.append(patched(DraftGate, "should_draft", lambda original: (lambda self, free_rate: gate)))
    entered = []
    try:
        for ctx in stack:
            ctx.__enter__()
            entered.append(ctx)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps + 1, **generate_kwargs)
        end = time.perf_counter()
        clock.close_round(end)
    finally:
        for ctx in reversed(entered):
            ctx.__exit__(None, None, None)
    rounds = clock.rounds
    for r in rounds:  # named parts inside get_candidates were counted in policy_ms too
        r["policy_ms"] -= sum(r[k] for k in subtract)
        r["loop_ms"] = r["total_ms"] - sum(r[k] for k in COMPONENTS if k != "loop_ms")
    drafter = generate_kwargs.get("assistant_model")
    sources = list(drafter.generation_stats.round_sources) if drafter is not None else []
    return rounds, sources, end - t0 - clock.prefill_forward_s, out.shape[1] - ids.shape[1]


def plain_step_ms(target, ids, steps: int) -> tuple[float, float]:
    """transformers' own greedy loop: (median ms from one decoding step's forward to the next's, the
    whole step; median ms of the forward alone)."""
    starts: list[float] = []
    forwards: list[float] = []

    def forward_wrap(fn):
        def inner(*args, **kwargs):
            t0 = time.perf_counter()
            starts.append(t0)
            out = fn(*args, **kwargs)
            forwards.append(time.perf_counter() - t0)
            return out

        return inner

    with patched(target, "forward", forward_wrap):
        with torch.no_grad():
            target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps + 1)
    steps_s = [b - a for a, b in zip(starts[1:], starts[2:])]  # decoding steps only: the prefill is the first forward
    return 1000 * statistics.median(steps_s), 1000 * statistics.median(forwards[1:])


def summarise(rounds: list[dict], sources: list[str]) -> dict:
    out = {"rounds": len(rounds)}
    groups: dict[str, list[dict]] = {"all": rounds}
    if len(sources) == len(rounds):
        for r, s in zip(rounds, sources):
            groups.setdefault(s, []).append(r)
    for name, rows in groups.items():
        out[name] = {"rounds": len(rows), **{k: round(statistics.mean(r[k] for r in rows), 3) for k in (*COMPONENTS, "total_ms")},
                     "median_total_ms": round(statistics.median(r["total_ms"] for r in rows), 3)}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--drafter", default=None, help="drafter folder (default: the target's shipped drafter)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--contexts", default="256,2048,8000")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default="hf-plain,plain,ngram,drafter,jetspec")
    parser.add_argument("--context-window", type=int, default=None, help="drafting_config.context_window of every JetSpec config")
    parser.add_argument("--document", default=None, help="read the prompt text from this file (a checkout without "
                        "hf_jetspec.data.long_prompts, for a before/after table)")
    parser.add_argument("--save-document", default=None, help="write the default prompt text to this file and stop")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    from hf_jetspec.tools.environment import describe_environment
    if args.save_document:
        from hf_jetspec.data.long_prompts import long_conversations

        Path(args.save_document).write_text(long_conversations()[1][1])
        return
    if not args.document:
        from hf_jetspec.data.long_prompts import long_conversations
    from hf_jetspec.tools.targets import load_drafter_for, load_target

    configs = args.configs.split(",")
    contexts = [int(c) for c in args.contexts.split(",")]
    result = {"command": "python benchmarks/round_profile.py " + " ".join(argv or __import__("sys").argv[1:]),
              "target": args.target, "steps": args.steps, "repeats": args.repeats, "context_window": args.context_window, "rows": []}
    for dtype in args.dtypes.split(","):
        target, tokenizer = load_target(args.target, dtype=dtype)
        drafter, what = load_drafter_for(target, args.target, args.drafter)
        shipped = drafter.drafting_config
        result.setdefault("environment", describe_environment(target.device))
        result["drafter"] = what
        # the long-chat sets' second conversation, uncut (about 11k tokens), or a saved copy of it
        doc = Path(args.document).read_text() if args.document else long_conversations()[1][1]
        all_ids = tokenizer(doc, return_tensors="pt", add_special_tokens=False)["input_ids"]
        for context in contexts:
            if all_ids.shape[1] < context:
                raise ValueError(f"the document has {all_ids.shape[1]} tokens, fewer than the context {context}")
            ids = all_ids[:, :context].to(target.device)
            plain_step_ms(target, ids[:, :64], 4)  # warm-up
            per = {c: [] for c in configs}
            for rep in range(args.repeats):
                for name in configs[rep % len(configs):] + configs[: rep % len(configs)]:
                    if name == "hf-plain":
                        step, fwd = plain_step_ms(target, ids, args.steps)
                        per[name].append({"step_ms": step, "forward_ms": fwd})
                        continue
                    changes = {"plain": dict(policy=True, ngram=False, ngram_seed=False),
                               "ngram": dict(policy=True, ngram=True),
                               "drafter": dict(policy=True, ngram=False, ngram_seed=False),
                               "jetspec": {}}[name]
                    gate = {"plain": False, "ngram": False, "drafter": True}.get(name)
                    if args.context_window is not None:
                        changes = {**changes, "context_window": args.context_window}
                    drafter.drafting_config = shipped.replace(**changes)
                    assistant_for(drafter).output_memory.clear()
                    rounds, sources, seconds, new = run_profiled(target, ids, {"assistant_model": drafter}, args.steps, gate)
                    per[name].append({"summary": summarise(rounds, sources), "ms_per_token": 1000 * seconds / max(new - 1, 1)})
            drafter.drafting_config = shipped
            hf = per.get("hf-plain") or []
            step = statistics.median(r["step_ms"] for r in hf) if hf else None
            row = {"dtype": dtype, "context": context, "hf_plain_step_ms": step,
                   "hf_plain_forward_ms": statistics.median(r["forward_ms"] for r in hf) if hf else None}
            for name in configs:
                if name == "hf-plain":
                    continue
                runs = per[name]
                best = min(runs, key=lambda r: r["summary"]["all"]["total_ms"])  # the quietest repeat
                summary = best["summary"]
                if step:
                    for key, group in summary.items():
                        if isinstance(group, dict):
                            group["overhead"] = round(group["total_ms"] / step, 3)
                            group["median_overhead"] = round(group["median_total_ms"] / step, 3)
                row[name] = {**summary, "ms_per_token": round(statistics.median(r["ms_per_token"] for r in runs), 3),
                             "round_ms_repeats": [round(r["summary"]["all"]["total_ms"], 3) for r in runs]}
            result["rows"].append(row)
            print(json.dumps({k: row[k] for k in ("dtype", "context", "hf_plain_step_ms", "hf_plain_forward_ms")}),
                  {n: {"round_ms": row[n]["all"]["total_ms"], "median_round_ms": row[n]["all"]["median_total_ms"],
                       "ms_per_token": row[n]["ms_per_token"]} for n in configs if n != "hf-plain"},
                  flush=True)
        del target, drafter
    result["environment"]["platform"] = platform.platform()
    print(markdown(result))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.output).with_suffix(".md").write_text(markdown(result) + "\n")


def markdown(result: dict) -> str:
    lines = ["| dtype | context | HF step ms | config | source | rounds | round ms (mean) | median | median / HF step | forward | states | "
             "cache fill | n-gram | draft | policy | loop |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        for name, data in row.items():
            if not isinstance(data, dict):
                continue
            for source, g in data.items():
                if not isinstance(g, dict) or (source == "all" and len([s for s in data if isinstance(data[s], dict)]) == 2):
                    continue
                step = row["hf_plain_step_ms"]
                lines.append(f"| {row['dtype']} | {row['context']} | {step:.1f} | {name} | {source} | {g['rounds']} | {g['total_ms']:.1f} | "
                             f"{g['median_total_ms']:.1f} | {g.get('median_overhead', float('nan')):.3f} | "
                             + " | ".join(f"{g[k]:.2f}" for k in COMPONENTS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
