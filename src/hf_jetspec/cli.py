"""The ``hf-jetspec`` command line."""

from __future__ import annotations

import argparse
import sys
import time

DEMO_PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in three sentences why the sky is blue.",
]


def load_drafter_for(target, target_name: str, drafter_path: str | None):
    """The drafter to use: ``drafter_path``, else the one shipped for ``target_name``, else a random one.

    Returns ``(drafter, description)``; the description says plainly when the drafter is untrained.
    """
    from .modeling_drafter import JetSpecDrafter
    from .targets import companion_drafter_path

    path = drafter_path or companion_drafter_path(target_name)
    if path is not None:
        return JetSpecDrafter.from_pretrained(str(path)).to(target.device).eval(), f"drafter {path}"
    drafter = JetSpecDrafter.for_target(target).eval()
    return drafter, "RANDOM-INIT drafter (no trained drafter is shipped for this target yet: expect tau ~1 and no speedup)"


def _chat_inputs(tokenizer, text: str):
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return tokenizer(text, return_tensors="pt")


def cmd_demo(args) -> int:
    import torch

    from .targets import load_target

    torch.manual_seed(0)
    print(f"loading target {args.target} ...", flush=True)
    target, tokenizer = load_target(args.target)
    drafter, what = load_drafter_for(target, args.target, args.drafter)
    drafter.drafting_config = drafter.drafting_config.replace(
        **{k: v for k, v in {"budget": args.budget, "num_jacobi_passes": args.jacobi_passes}.items() if v is not None}
    )
    print(f"using {what}; {drafter.drafting_config}\n", flush=True)
    tot = {"ar_t": 0.0, "js_t": 0.0, "tok": 0, "committed": 0, "rounds": 0}
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
        if not same:
            print("ERROR: JetSpec output differs from the target's greedy output", file=sys.stderr)
            return 1
        tot["ar_t"] += t1 - t0
        tot["js_t"] += t2 - t1
        tot["tok"] += n_new
        tot["committed"] += stats.committed_tokens
        tot["rounds"] += stats.rounds
    tau = tot["committed"] / max(tot["rounds"], 1)
    print(
        f"overall: AR {tot['tok'] / tot['ar_t']:.1f} tok/s, JetSpec {tot['tok'] / tot['js_t']:.1f} tok/s "
        f"({tot['ar_t'] / tot['js_t']:.2f}x), tau {tau:.2f}, outputs identical"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-jetspec", description="Lossless speculative decoding for transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="generate with the default target and its drafter, AR vs JetSpec side by side")
    demo.add_argument("--target", default="smollm2-135m")
    demo.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the one shipped for the target)")
    demo.add_argument("--max-new-tokens", type=int, default=96)
    demo.add_argument("--num-prompts", type=int, default=len(DEMO_PROMPTS))
    demo.add_argument("--budget", type=int, default=None)
    demo.add_argument("--jacobi-passes", type=int, default=None)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
