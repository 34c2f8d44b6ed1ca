"""What a draft costs in vLLM's offline engine: the step time per request with 0, 1, ..., K draft tokens, no HTTP server.

    make serve-env   # once: vLLM's CPU build in .venv-vllm
    python benchmarks/vllm_offline_steps.py --drafter hub_cards/jetspec-smollm2-135m-dflash \
        --lengths 1,2 --concurrency 1,4 --repeats 2 --output benchmarks/results/vllm_offline_steps_smollm2.json

``benchmarks/serve_vllm.py`` prices draft lengths on ``vllm serve``, where the OpenAI server's
process shares the two cores with the engine. This script runs vLLM's offline engine
(``vllm.LLM`` with its engine in the same process) and isolates what the engine itself spends. It runs in the project's environment: it
saves the target as a folder, exports the drafter (:func:`hf_jetspec.interop.vllm.export_for_vllm`),
then starts itself under the serving environment's Python once per engine (plain, then each
length), ``--repeats`` times in turn, so that every ratio is taken between neighbouring runs.

Each engine answers the bench prompts in batches of the concurrency, ``--rounds`` batches, every
request exactly ``--max-new-tokens`` tokens (``ignore_eos``: the batch stays full). From vLLM's
counters: the engine steps per request (plain: one per token; with drafts: the drafts plus each
request's prefill), the step time per request (wall x concurrency / steps), and per length the
**break-even accepted length**, ``step(k) / step(0)``: the mean committed tokens per step (1 plus
the accepted draft tokens) above which a draft of ``k`` tokens beats plain decoding in this engine.
For ``k = 1`` the break-even acceptance of position 1 is that ratio minus 1. vLLM's n-gram
proposer (``--ngram``) is timed beside, as tokens per second only: it drafts only where it finds
a match, so its steps are not counted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(job: dict) -> dict:
    """Runs under the serving environment: one engine, the timed batches at each concurrency, vLLM's counters."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"], seed=0, speculative_config=job["spec"],
              disable_log_stats=False)
    prompts = job["prompts"]
    params = SamplingParams(max_tokens=job["max_new_tokens"], temperature=0.0, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)

    def counters() -> dict:
        out = {}
        for metric in llm.get_metrics():
            if metric.name.startswith("vllm:spec_decode_num_"):
                out[metric.name.split("vllm:spec_decode_num_")[1]] = getattr(metric, "values", None) or getattr(metric, "value", 0)
        return out

    results = {}
    for conc in job["concurrency"]:
        before = counters()
        t0, tokens = time.perf_counter(), 0
        for r in range(job["rounds"]):
            batch = [TokensPrompt(prompt_token_ids=prompts[(r * conc + j) % len(prompts)]) for j in range(conc)]
            tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(batch, params, use_tqdm=False))
        wall = time.perf_counter() - t0
        delta = {}
        for key, value in counters().items():
            old = before.get(key, 0)
            delta[key] = [a - b for a, b in zip(value, old or [0] * len(value))] if isinstance(value, list) else value - old
        results[str(conc)] = {"tokens": tokens, "wall_s": wall, "requests": conc * job["rounds"], "counters": delta}
    return results


def step_summary(run: dict, concurrency: int, speculative: bool) -> dict:
    """Engine steps per request and the step time per request of one run (see the module docstring;
    ``speculative``: a draft every step, so the steps are the drafts plus the prefills)."""
    drafts = run["counters"].get("drafts", 0)
    steps = drafts + run["requests"] if speculative else run["tokens"]
    out = {"tokens_per_s": run["tokens"] / run["wall_s"], "request_steps": steps, "step_ms": 1000 * run["wall_s"] * concurrency / steps}
    if speculative:
        accepted = run["counters"].get("accepted_tokens", 0)
        per_pos = run["counters"].get("accepted_tokens_per_pos") or []
        out["mean_accepted_length"] = 1 + accepted / drafts if drafts else None
        out["position_acceptance"] = [p / drafts for p in per_pos] if drafts else []
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default="hub_cards/jetspec-smollm2-135m-dflash", help="a DFlash-layout JetSpecDrafter folder")
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--lengths", default="1,2", help="draft lengths to time beside plain decoding")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=8, help="batches of --concurrency requests per engine and level")
    ap.add_argument("--repeats", type=int, default=2, help="the engines run in turn this many times")
    ap.add_argument("--ngram", default='{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}',
                    help="vLLM's n-gram proposer, timed beside (its steps are not counted: it drafts only where it finds a match); '' skips it")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-gib", type=int, default=4)
    ap.add_argument("--venv", default=".venv-vllm")
    ap.add_argument("--work-dir", default="runs/vllm-offline")
    ap.add_argument("--output", required=False)
    args = ap.parse_args(argv)
    if args.worker:
        job = json.loads(Path(args.worker).read_text())
        print("RESULT " + json.dumps(worker(job)), flush=True)
        return
    if not args.output:
        ap.error("--output is required")

    import torch

    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.data import load_eval_prompts
    from hf_jetspec.interop.vllm import VllmServer, export_for_vllm, speculative_config, vllm_command
    from hf_jetspec.tools.bench import build_items, dump_json
    from hf_jetspec.tools.environment import describe_environment

    work = Path(args.work_dir)
    target, tokenizer = load_target(args.target, dtype="float32")
    target_dir = work / f"target-{args.target}"
    if not (target_dir / "config.json").is_file():
        target.save_pretrained(target_dir)
        tokenizer.save_pretrained(target_dir)
    drafter = JetSpecDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    drafter.attach_target(target)
    exported = export_for_vllm(drafter.eval(), work / "drafter-vllm", dtype="float32", target=str(target_dir), source=args.drafter)
    items = build_items(tokenizer, target, load_eval_prompts(args.prompts, limit=args.limit), args.max_new_tokens)
    prompts = [ids[0].tolist() for _, ids in items]
    # the serving environment as vllm serve gets it (OpenMP runtime, KV cache size, no usage statistics)
    _, env = vllm_command(VllmServer(model=str(target_dir), venv=args.venv, kv_cache_gib=args.kv_cache_gib))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in the worker's own process: no second process on the cores
    python = str(Path(args.venv) / "bin" / "python")
    lengths = [int(k) for k in args.lengths.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    engines = [("0", None)] + [(str(k), speculative_config(exported.folder, drafter.config, k=k)) for k in lengths]
    if args.ngram:
        engines.append(("ngram", json.loads(args.ngram)))
    runs: dict[int, dict[str, list[dict]]] = {c: {name: [] for name, _ in engines} for c in levels}
    for repeat in range(args.repeats):
        for name, spec in engines:
            job = {"model": str(target_dir), "dtype": args.dtype, "max_model_len": args.max_model_len, "spec": spec,
                   "prompts": prompts, "concurrency": levels, "rounds": args.rounds, "max_new_tokens": args.max_new_tokens}
            job_path, log = work / "job.json", work / f"engine-{name}-r{repeat}.log"
            job_path.write_text(json.dumps(job))
            for _ in range(2):  # this vLLM build now and then crashes loading its compile cache: one more start
                with open(log, "w") as f:
                    proc = subprocess.run([python, __file__, "--worker", str(job_path)], env=env, stdout=subprocess.PIPE, stderr=f, text=True)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if not proc.returncode and line is not None:
                    break
            else:
                raise RuntimeError(f"the engine {name!r} failed twice ({proc.returncode}); see {log}")
            for c, run in json.loads(line[len("RESULT "):]).items():
                summary = step_summary(run, int(c), name != "0")
                runs[int(c)][name].append(summary)
                print(f"repeat {repeat} {name} c={c}: {summary['tokens_per_s']:.1f} tok/s, {summary['step_ms']:.1f} ms per request-step"
                      + (f", accepted length {summary['mean_accepted_length']:.3f}" if name != "0" else ""), flush=True)
    by_level = {}
    for c in levels:
        plain = runs[c]["0"]
        row = {"plain": {"step_ms": [round(r["step_ms"], 2) for r in plain], "tokens_per_s": [round(r["tokens_per_s"], 1) for r in plain]}}
        for name, _ in engines[1:]:
            rs = runs[c][name]
            row[name] = {"tokens_per_s": [round(r["tokens_per_s"], 1) for r in rs],
                         "speedup": [round(r["tokens_per_s"] / p["tokens_per_s"], 3) for r, p in zip(rs, plain)],  # against its repeat's plain run
                         "mean_accepted_length": [round(r["mean_accepted_length"], 4) for r in rs if r["mean_accepted_length"]]}
            if name != "ngram":
                row[name] |= {"step_ms": [round(r["step_ms"], 2) for r in rs],
                              "position_acceptance": [round(x, 4) for x in rs[-1]["position_acceptance"]],
                              "break_even_accepted_length": round(statistics.median(r["step_ms"] / p["step_ms"] for r, p in zip(rs, plain)), 3)}
        by_level[str(c)] = row
    result = {"command": shlex.join(["python", "benchmarks/vllm_offline_steps.py", *(argv if argv is not None else sys.argv[1:])]),
              "target": args.target, "drafter": args.drafter, "export": exported.__dict__, "prompts": args.prompts, "limit": args.limit,
              "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "repeats": args.repeats, "dtype": args.dtype,
              "environment": describe_environment(torch.device("cpu")), "by_concurrency": by_level}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(dump_json(result))
    print(json.dumps(by_level, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
