"""The ``hf-jetspec`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .dtypes import CHOICES as DTYPE_CHOICES

DEMO_PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
]


def _chat_inputs(tokenizer, text: str) -> dict:
    import torch

    from ..data import chat_input_ids

    ids = chat_input_ids(tokenizer, text)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def cmd_demo(args) -> int:
    import torch

    from .targets import load_drafter_for, load_target

    torch.manual_seed(0)
    print(f"loading target {args.target} ({args.dtype}) ...", flush=True)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    drafter.drafting_config = drafter.drafting_config.replace(
        **{k: v for k, v in {"budget": args.budget, "num_jacobi_passes": args.jacobi_passes}.items() if v is not None}
    )
    print(f"using {what} in {target.dtype}; {drafter.drafting_config}\n", flush=True)
    exact_dtype = target.dtype == torch.float32
    tot = {"ar_t": 0.0, "js_t": 0.0, "tok": 0, "committed": 0, "rounds": 0, "same": 0, "n": 0}
    fp32_copy = {}

    def reference(name):
        if "model" not in fp32_copy:
            fp32_copy["model"] = load_target(name, dtype=torch.float32)[0]
        return fp32_copy["model"]

    warm = _chat_inputs(tokenizer, DEMO_PROMPTS[0])  # untimed: first-call costs (the policy's cost profile, kernels)
    target.generate(**warm, do_sample=False, max_new_tokens=8)
    target.generate(**warm, assistant_model=drafter, do_sample=False, max_new_tokens=8)
    for text in DEMO_PROMPTS[: args.num_prompts]:
        enc = _chat_inputs(tokenizer, text)
        n_prompt = enc["input_ids"].shape[1]
        t0 = time.perf_counter()
        ar = target.generate(**enc, do_sample=False, max_new_tokens=args.max_new_tokens)
        t1 = time.perf_counter()
        js = target.generate(**enc, assistant_model=drafter, do_sample=False, max_new_tokens=args.max_new_tokens)
        t2 = time.perf_counter()
        stats = drafter.generation_stats
        same = torch.equal(ar, js)
        n_new = js.shape[1] - n_prompt
        print(f"> {text}\n{tokenizer.decode(js[0, n_prompt:], skip_special_tokens=True).strip()}\n")
        print(
            f"  {n_new} tokens | AR {n_new / (t1 - t0):.1f} tok/s | JetSpec {n_new / (t2 - t1):.1f} tok/s | "
            f"tau {stats.tau or 0:.2f} | identical to AR: {same}\n",
            flush=True,
        )
        if not same and exact_dtype:
            print("ERROR: JetSpec output differs from the target's greedy output", file=sys.stderr)
            return 1
        if not same:
            from .numerics import score_divergence

            ref = reference(args.target)
            d = score_divergence(ref, enc["input_ids"], ar[0, n_prompt:].tolist(), js[0, n_prompt:].tolist(), 0)
            print(f"  differs from AR at token {d.position}: fp32 logit margin {d.fp32_margin:.3f} between the two tokens "
                  f"(a {target.dtype} near-tie; see hf_jetspec.tools.numerics)\n")
        tot["same"] += int(same)
        tot["n"] += 1
        tot["ar_t"] += t1 - t0
        tot["js_t"] += t2 - t1
        tot["tok"] += n_new
        tot["committed"] += stats.committed_tokens
        tot["rounds"] += stats.rounds
    tau = tot["committed"] / max(tot["rounds"], 1)
    print(
        f"overall: AR {tot['tok'] / tot['ar_t']:.1f} tok/s, JetSpec {tot['tok'] / tot['js_t']:.1f} tok/s "
        f"({tot['ar_t'] / tot['js_t']:.2f}x), tau {tau:.2f}, "
        + ("outputs identical" if exact_dtype else f"{tot['same']}/{tot['n']} outputs identical to AR ({target.dtype})")
    )
    return 0


def cmd_bench(args) -> int:
    from .bench import BenchConfig, markdown_table, run_bench

    config = BenchConfig(
        target=args.target,
        prompts=args.prompts,
        limit=args.limit,
        offset=args.offset,
        max_new_tokens=args.max_new_tokens,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        drafter=args.drafter,
        assistant=args.assistant,
        lm_source=args.lm_source,
        lm_int8=args.lm_int8,
        lm_head_vocab=args.lm_head_vocab,
        compile_backend=args.compile_backend,
        temperature=args.temperature,
        top_p=args.top_p,
        jacobi_passes=args.jacobi_passes,
        budget=args.budget,
        prompt_lookup_tokens=args.prompt_lookup_tokens,
        foresight=args.foresight,
        cache_size=args.cache_size,
        context_refreshes=args.context_refreshes,
        pipeline=args.pipeline,
        adapter=args.adapter,
        seed=args.seed,
        output=args.output,
        dtype=args.dtype,
        policy=args.policy == "on",
        tie_margin_items=args.tie_margin_items,
        fp32_head=args.fp32_head,
        batch_size=args.batch_size,
        tree=args.tree,
        tree_top_k=args.tree_top_k,
        baseline_drafter=args.baseline_drafter,
        learn_steps=args.learn_steps,
        learn_share=args.learn_share,
        learn_lr=args.learn_lr,
    )
    result = run_bench(config)
    print(markdown_table(result))
    jet = result["methods"].get("jetspec")
    if jet is not None:
        print(f"jetspec: {jet['drafter']}")
    if args.output:
        print(f"saved {args.output} and {args.output.rsplit('.', 1)[0]}.png")
    return 0


def _calibration_items(args, tokenizer, target) -> list:
    """Items of ``--prompts SET:OFFSET,...`` (``--per-source`` prompts each), as the bench builds them."""
    from .bench import build_items
    from ..data import load_eval_prompts

    prompts = []
    for spec in args.prompts.split(","):
        name, _, offset = spec.partition(":")
        prompts += load_eval_prompts(name, limit=args.per_source, offset=int(offset or 0))
    return build_items(tokenizer, target, prompts, args.max_new_tokens)


def cmd_calibrate(args) -> int:
    import torch

    from ..assistant import assistant_for
    from ..foresight.calibrate import fit_calibration, record_rounds, save_records
    from .targets import companion_adapter_path, load_drafter_for, load_target

    torch.manual_seed(0)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    adapter = args.adapter or companion_adapter_path(args.target)
    if adapter is None:
        print(f"error: no foresight adapter shipped for {args.target!r}; pass --adapter", file=sys.stderr)
        return 2
    assistant = assistant_for(drafter)
    assistant.attach_foresight(str(adapter), calibration=None)
    if args.budget:
        drafter.drafting_config = drafter.drafting_config.replace(budget=args.budget)
    items = _calibration_items(args, tokenizer, target)
    print(f"recording rounds on {len(items)} calibration prompts with {what}, adapter {adapter}", flush=True)
    records = record_rounds(target, assistant, items, args.max_new_tokens, cache_size=args.cache_size)
    cal = fit_calibration(records, miscoverage=args.miscoverage, budget=drafter.drafting_config.budget)
    out = args.output or str(adapter)
    path = cal.save(out)
    if args.records:
        save_records(records, args.records)
    print(f"{cal.num_rounds} rounds: w = {[round(w, 3) for w in cal.weights]}, beta = {cal.beta:.3f}, "
          f"threshold = {cal.threshold:.4g} (coverage {cal.coverage:.2f})\nsaved {path}")
    return 0


def cmd_calibrate_policy(args) -> int:
    import torch

    from ..policy.calibrate import calibrate_acceptance, record_acceptance
    from .targets import companion_drafter_path, load_drafter_for, load_target

    torch.manual_seed(0)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    changes = {"budget": args.budget, "num_jacobi_passes": args.jacobi_passes}
    drafter.drafting_config = drafter.drafting_config.replace(**{k: v for k, v in changes.items() if v is not None})
    items = _calibration_items(args, tokenizer, target)
    print(f"recording rounds on {len(items)} held-out prompts with {what} ({target.dtype})", flush=True)
    per_item = record_acceptance(target, drafter, items, args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    # interleave sources so the held-out quarter has every source
    order = sorted(range(len(per_item)), key=lambda i: (i % args.per_source, i))
    model = calibrate_acceptance(
        [per_item[i] for i in order],
        num_jacobi_passes=drafter.drafting_config.num_jacobi_passes,
        budget=drafter.drafting_config.budget,
        prompts=[p.strip() for p in args.prompts.split(",")],
        temperature=args.temperature,
        top_p=args.top_p if args.temperature > 0 else 1.0,
    )
    out = args.output or args.drafter or str(companion_drafter_path(args.target))
    path = model.save(out)
    print(f"{model.num_rounds} training rounds: w = {[round(w, 3) for w in model.weights]}; held-out log-likelihood per round "
          f"{model.held_out_log_likelihood:.3f} (raw probabilities: {model.raw_log_likelihood:.3f})\nsaved {path}")
    return 0


def cmd_export_vllm(args) -> int:
    import torch

    from ..interop.vllm import export_for_vllm, require_servable, sweep_step_costs
    from ..drafter.modeling_drafter import JetSpecDrafter

    drafter = JetSpecDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    try:
        require_servable(drafter.config)  # before loading a target for a drafter vLLM cannot run anyway
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    serve_target = args.target
    if drafter.config.draft_vocab_size is not None:
        # a restricted draft vocabulary is written as the target's head rows: the target is needed
        from .targets import converted_folder, load_target, resolve_embedded

        name = args.target or drafter.config.target_name_or_path
        if not name:
            print("error: this drafter has a restricted draft vocabulary, written as its target's head rows: pass --target", file=sys.stderr)
            return 2
        embedded = resolve_embedded(name)
        try:
            if embedded is not None:
                target, _ = load_target(name, dtype=torch.float32)
            else:  # only its head is read: no tokenizer needed
                from transformers import AutoModelForCausalLM

                target = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        except (OSError, ValueError) as err:
            print(f"error: cannot load the target {name!r} for the draft vocabulary's head rows ({err}); pass --target with an "
                  "embedded target's name (e.g. smollm2-135m) or a local folder", file=sys.stderr)
            return 2
        try:
            drafter.attach_target(target)
        except ValueError as err:  # the wrong target for this drafter
            print(f"error: {err}", file=sys.stderr)
            return 2
        if embedded is not None:  # vLLM serves the converted folder this head came from
            serve_target = str(converted_folder(embedded))
    acceptance = costs = None
    if args.step_costs_ms is not None and args.step_costs_from is not None:
        print("error: --step-costs-ms and --step-costs-from are two sources of the same costs: give one", file=sys.stderr)
        return 2
    if (args.acceptance is None) != (args.step_costs_ms is None and args.step_costs_from is None):
        print("error: --acceptance and --step-costs-ms (or --step-costs-from) go together (the profile and vLLM's costs it is "
              "priced with)", file=sys.stderr)
        return 2
    if args.acceptance is not None:
        path, _, method = args.acceptance.partition(":")
        with open(path) as f:
            profile = json.load(f)["methods"][method or "jetspec"]["position_acceptance"]
        acceptance = profile.get("drafter") or profile["all"]
        if args.step_costs_ms is not None:
            costs = [float(x) / 1000 for x in args.step_costs_ms.split(",")]
        else:
            with open(args.step_costs_from) as f:
                sweep = json.load(f)
            try:
                costs = sweep_step_costs(sweep)
            except ValueError as err:
                print(f"error: {args.step_costs_from}: {err}", file=sys.stderr)
                return 2
    try:
        record = export_for_vllm(drafter, args.output, dtype=args.dtype, target=serve_target, source=args.drafter,
                                 acceptance=acceptance, step_costs=costs, draft_cost=args.draft_cost_ms / 1000)
    except (ValueError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {record.folder} ({', '.join(record.files)})\nserve with: vllm serve {record.target} --dtype {record.dtype} "
          f"--speculative-config '{json.dumps(record.speculative_config)}'")
    return 0


def cmd_train(args) -> int:
    from .train import TrainCommandConfig, run_train_command

    from .train import verdict_text

    config = TrainCommandConfig(target=args.target, output=args.output, hours=args.hours, dtype=args.dtype, device=args.device,
                                eval_prompts=args.eval_prompts, calibration_prompts=args.calibration_prompts,
                                verdict_prompts=args.verdict_prompts)
    record = run_train_command(config, resume=args.resume)
    curve = record["curve"]
    print(f"{record['regenerated_sequences']} regenerated answers, {record['train_steps']} training steps ({record['epochs']} epochs), "
          f"held-out drafter-alone tau {curve[-1]['tau'] if curve else None}; this run {record['this_run_hours']} h of a "
          f"{record['budget_hours']} h budget; drafter and card in {os.path.join(args.output, 'drafter')}")
    print(verdict_text(record["verdict"], record["command"]).replace("**", ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-jetspec", description="Lossless speculative decoding for transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate with the default target and its drafter, AR vs JetSpec side by side")
    demo.add_argument("--target", default="smollm2-135m")
    demo.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the one shipped for the target; \"random\": an untrained one)")
    demo.add_argument("--max-new-tokens", type=int, default=96)
    demo.add_argument("--num-prompts", type=int, default=len(DEMO_PROMPTS))
    demo.add_argument("--budget", type=int, default=None)
    demo.add_argument("--jacobi-passes", type=int, default=None)
    demo.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="auto: bf16 where the device has native bf16, else fp32")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="methods side by side on the same prompts, interleaved, saved as JSON + plot")
    bench.add_argument("--target", default="smollm2-135m")
    bench.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the one shipped for the target; \"random\": an untrained one)")
    bench.add_argument("--baseline-drafter", default=None,
                       help="a second drafter (folder or Hub id) for the jetspec-baseline method, measured in the same run")
    bench.add_argument("--prompts", default="gsm8k",
                       help="gsm8k | humaneval | mt-bench | mt-bench-code-reasoning | aime25 | gpqa (science questions) | continuation (plain text, base models) | long-2k|4k|8k "
                            "(or long-chat-/long-code-2k|4k|8k) | FILE.jsonl")
    bench.add_argument("--limit", type=int, default=20)
    bench.add_argument("--offset", type=int, default=0, help="skip this many prompts of the fixed shuffle first")
    bench.add_argument("--max-new-tokens", type=int, default=256)
    bench.add_argument("--methods", default="ar,prompt-lookup,jetspec", help="comma list of ar, ar-compiled, prompt-lookup, drafter-free, drafter-free-tree, jetspec, jetspec-chain, jetspec-fixed, jetspec-length, jetspec-ngram, jetspec-j0, jetspec-j1, jetspec-j2, jetspec-tree, jetspec-tree-branched, jetspec-tree-policy, jetspec-tree-branched-policy, jetspec-tree-policy-j0, jetspec-tree-policy-j1, jetspec-baseline, jetspec-compiled, jetspec-compiled-drafter, jetspec-int8, jetspec-online, assisted, hf-dflash")
    bench.add_argument("--tree", default=None, choices=["off", "auto"],
                       help="tree verification for every jetspec method (default: the drafter's own drafting_config)")
    bench.add_argument("--tree-top-k", type=int, default=None,
                       help="candidates per depth a tree may branch into (default: the drafter's drafting_config)")
    bench.add_argument("--assistant", default=None, help="assistant model for 'assisted' (default: --lm-source, else the 0.5B model for qwen2.5-coder-1.5b)")
    bench.add_argument("--lm-source", default=None,
                       help="jetspec-lm: the small LM proposing chains beside the drafter (an embedded name or a path; default as --assistant)")
    bench.add_argument("--lm-int8", default=None, type=lambda v: {"on": True, "off": False}[v], choices=[True, False],
                       metavar="{on,off}", help="jetspec-lm: int8 products in the LM (default: on the CPU)")
    bench.add_argument("--lm-head-vocab", type=int, default=None, help="jetspec-lm: rows of the LM's restricted head (default: the whole head)")
    bench.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    bench.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (with --temperature > 0)")
    bench.add_argument("--jacobi-passes", type=int, default=None)
    bench.add_argument("--budget", type=int, default=None)
    bench.add_argument("--compile-backend", default="inductor", help="torch.compile backend of ar-compiled and jetspec-compiled (eager: trace only)")
    bench.add_argument("--prompt-lookup-tokens", type=int, default=10)
    bench.add_argument("--foresight", action=argparse.BooleanOptionalAction, default=None,
                       help="pre-draft the next block for likely outcomes while verifying (needs a foresight adapter)")
    bench.add_argument("--cache-size", type=int, default=None, help="outcomes pre-drafted per round (B)")
    bench.add_argument("--context-refreshes", type=int, default=None, help="context refreshes R <= J per round")
    bench.add_argument("--pipeline", default=None, choices=["auto", "thread", "off"], help="where foresight work runs")
    bench.add_argument("--adapter", default=None, help="foresight adapter folder (default: the one shipped for the target)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, help="target dtype; auto: bf16 where the device has native bf16, else fp32")
    bench.add_argument("--policy", default="on", choices=["on", "off"], help="round policy of the jetspec method")
    bench.add_argument("--tie-margin-items", type=int, default=4, help="held-out prompts for the tie-margin measurement (outside fp32)")
    bench.add_argument("--fp32-head", action="store_true", help="compute the target's final norm and LM head in fp32 (every method)")
    bench.add_argument("--learn-steps", type=int, default=4, help="jetspec-online: optimizer steps after each item")
    bench.add_argument("--learn-share", type=float, default=None,
                       help="jetspec-online: keep learning time at this share of its generation time instead (steps then cap it)")
    bench.add_argument("--learn-lr", type=float, default=1e-4, help="jetspec-online: learning rate")
    bench.add_argument("--batch-size", type=int, default=1,
                       help="prompts per generate call, grouped in file order and left-padded (ar and drafter-free; the other "
                            "methods record why they cannot run on several rows)")
    bench.add_argument("--output", default=None, help="OUT.json (a plot OUT.png is saved beside it)")
    bench.set_defaults(func=cmd_bench)

    train = sub.add_parser("train", help="regenerate with a target, train its drafter, calibrate, write a Hub-ready folder (resumable)")
    train.add_argument("--target", required=True, help="an embedded target name or anything from_pretrained accepts")
    train.add_argument("--output", required=True, help="the run's folder; run the same command again to resume")
    train.add_argument("--hours", type=float, default=1.0, help="wall-clock budget of the whole command, verdict included")
    train.add_argument("--resume", action="store_true", help="continue a finished run for --hours more: more answers, its drafter trained on")
    train.add_argument("--verdict-prompts", type=int, default=4, help="further held-out MT-Bench questions for the final verdict")
    train.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    train.add_argument("--device", default=None, help="cpu or cuda (default: the loader's choice)")
    train.add_argument("--eval-prompts", type=int, default=6, help="held-out MT-Bench questions for the learning curve")
    train.add_argument("--calibration-prompts", type=int, default=6, help="other held-out MT-Bench questions for the round policy")
    train.set_defaults(func=cmd_train)

    cal = sub.add_parser("calibrate", help="fit the foresight selection rule on rounds recorded from held-out prompts")
    cal.add_argument("--target", default="smollm2-135m")
    cal.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    cal.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for the target)")
    cal.add_argument("--adapter", default=None, help="foresight adapter folder (default: the one shipped for the target)")
    cal.add_argument("--prompts", default="gsm8k:100,humaneval:100,mt-bench:60",
                     help="comma list of SOURCE[:OFFSET]; use prompts after the benchmark's own (never benchmark prompts)")
    cal.add_argument("--per-source", type=int, default=8)
    cal.add_argument("--max-new-tokens", type=int, default=128)
    cal.add_argument("--budget", type=int, default=None)
    cal.add_argument("--cache-size", type=int, default=4)
    cal.add_argument("--miscoverage", type=float, default=0.1, help="conformal threshold keeps the realised outcome at rate 1 - this")
    cal.add_argument("--output", default=None, help="folder for foresight_calibration.json (default: the adapter folder)")
    cal.add_argument("--records", default=None, help="also save the recorded rounds as JSONL (for replay)")
    cal.set_defaults(func=cmd_calibrate)

    pol = sub.add_parser("calibrate-policy", help="fit the round policy's acceptance model on rounds recorded from held-out prompts")
    pol.add_argument("--target", default="smollm2-135m")
    pol.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    pol.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for the target)")
    pol.add_argument("--prompts", default="gsm8k:100,humaneval:100,mt-bench:60",
                     help="comma list of SET:OFFSET; the offsets keep calibration prompts apart from the benchmarked ones")
    pol.add_argument("--per-source", type=int, default=6)
    pol.add_argument("--max-new-tokens", type=int, default=128)
    pol.add_argument("--budget", type=int, default=None)
    pol.add_argument("--jacobi-passes", type=int, default=None)
    pol.add_argument("--temperature", type=float, default=0.0,
                     help="record sampled rounds at this temperature (drafts drawn from q); the fit goes to "
                          "acceptance_calibration_sampled.json and is used whenever generate samples (0: greedy rounds)")
    pol.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling of the recorded rounds (with --temperature)")
    pol.add_argument("--output", default=None, help="folder for the calibration file (default: the drafter folder)")
    pol.set_defaults(func=cmd_calibrate_policy)

    exp = sub.add_parser("export-vllm", help="write a DFlash-layout drafter as the folder vLLM's dflash method serves")
    exp.add_argument("--drafter", required=True, help="a JetSpecDrafter folder trained with --dflash-layout and bidirectional attention")
    exp.add_argument("--output", required=True, help="the folder to write (model.safetensors, config.json, README.md)")
    exp.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="weights' dtype in the folder")
    exp.add_argument("--target", default=None, help="the target: an embedded name (e.g. smollm2-135m: its converted folder is served), a Hub id "
                          "or a folder (default: the drafter config's); loaded when the drafter has a restricted draft "
                          "vocabulary, whose head rows it writes")
    exp.add_argument("--acceptance", default=None,
                     help="BENCH.json[:METHOD]: the drafter's acceptance per position from a bench run (method default jetspec, "
                          "run with --policy off --tree off); with --step-costs-ms, num_speculative_tokens is chosen from them")
    exp.add_argument("--step-costs-ms", default=None, help="vLLM's step time with 0, 1, 2, ... draft tokens, comma-separated ms")
    exp.add_argument("--step-costs-from", default=None, metavar="SWEEP.json",
                     help="a benchmarks/serve_vllm.py result with a step-cost sweep: the costs at every concurrency it measured, "
                          "for a batch-size schedule (num_speculative_tokens_per_batch_size: the length follows the batch, "
                          "0 where a draft does not pay)")
    exp.add_argument("--draft-cost-ms", type=float, default=0.0, help="vLLM's drafting forward, ms")
    exp.set_defaults(func=cmd_export_vllm)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
