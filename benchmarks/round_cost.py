"""Milliseconds per drafting round: the drafter's J0 + J passes and in-line foresight, against a plain target step.

    python benchmarks/round_cost.py --output benchmarks/results/round_cost_smollm2.json
    python benchmarks/round_cost.py --tree before=OLD_CHECKOUT/src --tree after=src --tree compiled=src@compile --output ...
    python benchmarks/round_cost.py --dtypes bfloat16 --tree eager=src --tree int8=src@int8 --tree compiled=src@compile \
        --tree compiled-int8=src@compile+int8 --output ...

Every figure is the median of ``--iters`` timed calls after a warm-up, all measured calls taking
turns (so machine noise spreads over all of them), each drafting call right after an untimed
target step (as in a round: drafting follows verification, with the caches as the target's
forward left them), over a verified context of
``--context`` tokens (a real prompt and the target's own continuation). Measured per dtype:

- ``target_step_ms``: one plain 1-token target forward over that context (the unit of everything);
- ``draft_ms[budget][J]``: one round of plain drafting, J0 plus exactly J Jacobi passes (no early
  stop, so the figure does not depend on the data), budgets 16 and 32;
- ``draft_share_of_step[budget][J]``: that round over the plain step of the same interpreter (with
  several repeats, the median of the repeats' own shares: the step's speed drifts between runs on a
  shared machine, and a ratio of two separate medians would mix runs);
- ``foresight_ms[adapter R]``: one in-line foresight round (``ForesightEngine.predraft``: score the
  block under verification, select B = 4 outcomes, draft them with J = 1 and R = 0 or 1 context
  refreshes), with a trained-shape
  adapter (one layer per read layer; timing does not depend on its weights) and the shipped
  layer-skip adapter.

A tree marked ``@compile`` drafts through the compiled step (``DraftingConfig(compile=True)``) and
also reports ``compile_s``, the first call of each budget; one marked ``@int8`` multiplies in int8
(``DraftingConfig(int8=True)``); ``@compile+int8`` does both. Marked trees measure plain drafting only
(no foresight rows). With several ``--tree`` entries the same measurement runs on each source tree in its own
interpreter, the trees alternating ``--repeats`` times (the median of the repeats is kept), so a
before/after table is measured side by side in one run. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DRAFTER = "hub_cards/jetspec-smollm2-135m"
DEFAULT_LAYERSKIP = "hub_cards/jetspec-smollm2-135m-foresight-layerskip"


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _timed_interleaved(fns: dict, iters: int, warmup: int = 3, before=None) -> dict:
    """Median milliseconds of each callable, the callables taking turns (a burst of machine noise then
    hits one sample of each, not all samples of one). ``before`` (untimed) runs before every timed
    call: a target step, so that drafting is timed as in a round, right after verification, with
    whatever the target's forward left in the caches."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            if before is not None and fn is not before:
                before()
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: round(1000 * _median(v), 2) for name, v in samples.items()}


def plain_target_step(target, ids, n: int):
    """A callable running one plain 1-token target forward over an ``n``-token KV cache of ``ids``
    (the cache is cropped back to ``n`` rows first, so every call costs the same)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    target(input_ids=ids[:, :n], cache=cache, use_cache=True)

    def step():
        extra = cache.get_seq_length() - n
        if extra > 0:
            cache.crop(-extra)
        target(input_ids=ids[:, n : n + 1], cache=cache, use_cache=True, position_ids=torch.tensor([[n]]))

    return step


def measure(args) -> dict:
    """One tree, one dtype: every figure of the module docstring."""
    import torch

    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.data import load_eval_prompts
    from hf_jetspec.drafter.drafting_config import DraftingConfig
    from hf_jetspec.foresight import ForesightAdapter, ForesightCalibration, ForesightDecoder, ForesightEngine, LayerSkipAdapter

    torch.manual_seed(0)
    torch.set_grad_enabled(False)  # inference throughout, as inside generate
    target, tok = load_target(args.target, dtype=args.dtype)
    drafter = JetSpecDrafter.from_pretrained(args.drafter)
    drafter.attach_target(target)
    layer_ids = list(drafter.config.target_layer_ids)

    # a verified context: a GSM8K prompt and the target's greedy continuation, cut to --context tokens
    prompt = load_eval_prompts("gsm8k", limit=1)[0].turns[0]
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        need = max(0, args.context + 1 - ids.shape[1])
        if need:
            ids = target.generate(ids, max_new_tokens=need, min_new_tokens=need, do_sample=False)
        ids = ids[:, : args.context + 1]
        out = target(ids[:, :-1], output_hidden_states=True)
    hidden = out.hidden_states
    n = args.context
    positions = torch.arange(n)
    states = torch.cat([hidden[i + 1] for i in layer_ids], dim=-1)
    seq = ids[0]

    def new_cache(model):
        maker = getattr(model, "new_cache", None)
        if maker is not None:
            return maker()
        from hf_jetspec.drafter.drafter_cache import DrafterCache

        return DrafterCache(model.config.num_hidden_layers)

    result: dict = {"dtype": str(target.dtype).replace("torch.", ""), "context": n}

    step = plain_target_step(target, ids, n)
    fns = {"target_step": step}

    # plain drafting rounds
    if args.compile:
        drafter.compile_drafting()
    if args.int8:
        drafter.set_int8_drafting(True)
    dcache = new_cache(drafter)
    drafter.append_context(dcache, states, positions)
    gen = torch.Generator().manual_seed(0)
    anchor = seq[n : n + 1]
    if args.compile:
        result["compile_s"] = {}
    for budget in args.budgets:
        gamma = budget - 1
        noise = seq[:n][torch.randint(0, n, (gamma - 1,), generator=gen)]
        block = torch.cat([anchor, noise])
        if args.compile:  # the first call of a block length compiles
            t0 = time.perf_counter()
            drafter.draft_block(dcache, block, n)
            result["compile_s"][str(budget)] = round(time.perf_counter() - t0, 1)
        for passes in args.passes:
            def round_(block=block, passes=passes):
                draft = drafter.draft_block(dcache, block, n)
                for _ in range(passes):
                    draft = drafter.draft_block(dcache, torch.cat([anchor, draft[:-1]]), n)
                return draft

            fns[f"draft/{budget}/J{passes}"] = round_

    if args.compile or args.int8:
        return _collect(result, _timed_interleaved(fns, args.iters, before=step))
    # in-line foresight rounds (B = 4, J = 1, R = 0 and R = 1), with both adapters
    options_by_r = {r: DraftingConfig(budget=16, num_jacobi_passes=1, num_context_refreshes=r, foresight=True, cache_size=4, pipeline="off")
                    for r in (0, 1)}
    options = options_by_r[0]
    adapters = {
        "trained-shape (1 layer per read layer)": ForesightAdapter.for_drafter(drafter, layers_per_module=1),
        "layer-skip (shipped)": LayerSkipAdapter.from_pretrained(args.layerskip),
    }
    calibration = ForesightCalibration.load(args.layerskip)
    gamma = options.budget - 1
    block = torch.cat([anchor, seq[:n][torch.randint(0, n, (gamma - 1,), generator=gen)]])
    draft, logits = drafter.draft_block(dcache, block, n, return_logits=True)
    tokens = torch.cat([anchor, draft])
    for name, adapter in adapters.items():
        adapter.attach_target(target)
        for r, opts in options_by_r.items():
            engine = ForesightEngine(drafter, adapter, ForesightDecoder(target, max(layer_ids)), calibration, opts)
            engine.observe(states, hidden, n, positions)

            def fround(engine=engine):
                return engine.predraft(dcache, tokens, n, logits, seq[:n])

            fns[f"foresight/{name} R{r}"] = fround
    return _collect(result, _timed_interleaved(fns, args.iters, before=step))


def _collect(result: dict, ms: dict) -> dict:
    """Nest the flat timing names ("draft/16/J1", "foresight/NAME") into the result."""
    result["target_step_ms"] = ms.pop("target_step")
    for name, value in ms.items():
        kind, _, rest = name.partition("/")
        if kind == "draft":
            budget, passes = rest.split("/")
            result.setdefault("draft_ms", {}).setdefault(budget, {})[passes] = value
            # the share of a step within this interpreter: the ratio that machine drift between runs leaves alone
            result.setdefault("draft_share_of_step", {}).setdefault(budget, {})[passes] = round(value / result["target_step_ms"], 4)
        else:
            result.setdefault("foresight_ms", {})[rest] = value
    return result


def _git_rev(src: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _dirty(src: str) -> bool:
    try:
        out = subprocess.run(["git", "-C", src, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=True).stdout
        return bool(out.strip())
    except (OSError, subprocess.CalledProcessError):
        return False


def _worker(src: str, dtype: str, args) -> dict:
    src, flags = _tree_flags(src)
    cmd = [sys.executable, __file__, "--worker", *(f"--{f}" for f in flags), "--dtype", dtype, "--target", args.target, "--drafter", args.drafter,
           "--layerskip", args.layerskip, "--context", str(args.context), "--iters", str(args.iters),
           "--budgets", ",".join(map(str, args.budgets)), "--passes", ",".join(map(str, args.passes))]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker for {src} ({dtype}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tree_flags(spec: str) -> tuple[str, list[str]]:
    """``SRC_DIR[@FLAG[+FLAG]]`` -> (SRC_DIR, flags), flags among compile and int8."""
    src, _, marks = spec.partition("@")
    flags = [f for f in marks.split("+") if f]
    unknown = set(flags) - {"compile", "int8"}
    if unknown:
        raise SystemExit(f"unknown tree flag(s) {sorted(unknown)} in {spec!r}: use @compile, @int8 or @compile+int8")
    return src, flags


def _merge(runs: list[dict]) -> dict:
    """Per-entry median over repeated runs of the same tree and dtype."""
    first = runs[0]
    out = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = _merge([r[key] for r in runs])
        elif isinstance(value, float):  # the median is one of the runs' values, rounded by the worker already
            out[key] = _median([r[key] for r in runs])
        else:
            out[key] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=DEFAULT_DRAFTER)
    ap.add_argument("--layerskip", default=DEFAULT_LAYERSKIP)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--budgets", default="16,32")
    ap.add_argument("--passes", default="0,1,2")
    ap.add_argument("--tree", action="append", default=[],
                    help="LABEL=SRC_DIR[@compile][+int8] (@compile: the compiled drafting step; @int8: int8 products; "
                         "repeatable); default: this checkout's src")
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--int8", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--output")
    args = ap.parse_args()
    args.budgets = [int(x) for x in str(args.budgets).split(",")]
    args.passes = [int(x) for x in str(args.passes).split(",")]
    if args.worker:
        print(json.dumps(measure(args)))
        return
    here = Path(__file__).resolve().parents[1]
    trees = dict(t.split("=", 1) for t in args.tree) or {"current": str(here / "src")}
    dtypes = args.dtypes.split(",")
    runs: dict = {label: {d: [] for d in dtypes} for label in trees}
    for r in range(args.repeats):
        for label, src in trees.items():
            for dtype in dtypes:
                res = _worker(src, dtype, args)
                runs[label][dtype].append(res)
                print(f"repeat {r + 1}/{args.repeats} {label} {dtype}: {json.dumps(res)}", file=sys.stderr)
    import torch

    from hf_jetspec.tools.environment import describe_environment

    result = {
        "command": "python benchmarks/round_cost.py " + " ".join(sys.argv[1:]),
        "trees": {label: {"commit": _git_rev(_tree_flags(src)[0]), "uncommitted_changes": _dirty(_tree_flags(src)[0]),
                          "compiled_step": "compile" in _tree_flags(src)[1], "int8": "int8" in _tree_flags(src)[1]}
                  for label, src in trees.items()},
        "environment": describe_environment(torch.device("cpu")),
        "repeats": args.repeats,
        "results": {label: {d: _merge(v) for d, v in per.items()} for label, per in runs.items()},
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
