"""The current-results page: the shipped configuration's numbers, generated from saved result files.

    python benchmarks/current_results.py            # rewrite the page at the top of benchmarks/README.md
    python benchmarks/current_results.py --check    # fail if the page is not what the files say

The same run rewrites the headline table of the project's front page (``README.md``), a few rows
of the same files (``HEADLINE``), and ``--check`` checks both.

``CURRENT`` lists, per table, the result files that describe what a user gets today (the shipped
drafters with their shipped defaults). When a run replaces one, change its entry here and rerun;
the dated reports below the page keep the history. Every row gives the command that reproduces it,
rebuilt from the run's own saved configuration, and the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"
START, END = "<!-- current-results:start -->", "<!-- current-results:end -->"

# (table title, [(row label, result file, our method)]): the runs of the shipped configuration
CURRENT = [
    ("SmolLM2-135M-Instruct, greedy, bf16 (shipped drafter version 3, default settings: tree rounds under the policy)", [
        ("GSM8K (10)", "smollm2_v3_defaults_gsm8k_bf16.json", "jetspec"),
        ("HumanEval (10)", "smollm2_v3_defaults_humaneval_bf16.json", "jetspec"),
        ("MT-Bench (5, both turns)", "smollm2_v3_defaults_mt-bench_bf16.json", "jetspec"),
    ]),
    ("Qwen2.5-Coder-1.5B-Instruct, greedy, bf16 (shipped drafter, tree rounds under the policy)", [
        ("HumanEval", "qwen15_shipped_humaneval_bf16.json", "jetspec-tree-policy"),
        ("MT-Bench coding + reasoning", "qwen15_shipped_mt-bench-code-reasoning_bf16.json", "jetspec-tree-policy"),
    ]),
    ("Sampling, top-p 0.9, drafts drawn from the drafter's q (the defaults: chain rounds above T = 0.5, tree rounds up to it; "
     "SmolLM2 rows measured with drafter version 2 unless marked v3; at T = 0.7 the other-rounds column is the same "
     "configuration drawn again in the same run)", [
        ("SmolLM2 v3, MT-Bench, T = 0.7 (20 prompts)", "sampling_smollm2_mt-bench_t0.7_lazy_20.json", "jetspec"),
        ("SmolLM2, MT-Bench, T = 1.0", "sampling_smollm2_mt-bench_t1.0.json", "jetspec"),
        ("SmolLM2, GSM8K, T = 0.7", "sampling_smollm2_gsm8k_t0.7.json", "jetspec"),
        ("SmolLM2, HumanEval, T = 0.7", "sampling_smollm2_humaneval_t0.7.json", "jetspec"),
        ("Qwen, HumanEval, T = 0.7", "sampling_qwen_humaneval_t0.7_lazy.json", "jetspec"),
        ("Qwen, HumanEval, T = 0.2 (trees)", "sampling_qwen_humaneval_t0.2.json", "jetspec-tree-policy"),
    ]),
    ("Drafter-free, greedy, bf16 (`DrafterFreeAssistant`: no drafter weights; n-gram and output-memory proposals under the "
     "round policy; the hf_jetspec column is this path, beside transformers' prompt lookup in the same run)", [
        ("SmolLM2-135M, GSM8K (20)", "drafter_free_compiled_peer_smollm2_gsm8k.json", "drafter-free"),
        ("SmolLM2-135M, HumanEval (20)", "drafter_free_compiled_peer_smollm2_humaneval.json", "drafter-free"),
        ("SmolLM2-135M, MT-Bench (5, both turns)", "drafter_free_compiled_peer_smollm2_mt-bench.json", "drafter-free"),
        ("Qwen2.5-Coder-1.5B, HumanEval (6)", "drafter_free_qwen15_humaneval.json", "drafter-free"),
        ("Gemma-3-270M (base), continuations (20)", "drafter_free_compiled_peer_gemma3_continuation.json", "drafter-free"),
    ]),
    ("Drafter-free tree rounds, greedy, bf16 (opt-in: `DrafterFreeConfig(tree=True)`, a trie of the distinct n-gram "
     "continuations per round; the hf_jetspec column is that path; the chain path ran in the same run, see "
     "docs/reports/2026-12-03-drafter-free-trees.md)", [
        ("SmolLM2-135M, GSM8K (20)", "drafter_free_compiled_peer_smollm2_gsm8k.json", "drafter-free-tree"),
        ("SmolLM2-135M, HumanEval (20)", "drafter_free_compiled_peer_smollm2_humaneval.json", "drafter-free-tree"),
        ("SmolLM2-135M, MT-Bench (5, both turns)", "drafter_free_compiled_peer_smollm2_mt-bench.json", "drafter-free-tree"),
        ("Qwen2.5-Coder-1.5B, HumanEval (6)", "drafter_free_trees_qwen15_humaneval.json", "drafter-free-tree"),
    ]),
    ("Compiled rounds, greedy, bf16 (opt-in: `compiled_rounds=True`, the shipped drafters otherwise at their defaults; "
     "\"vs compiled plain\" is against transformers' plain decoding on a static cache with the compiled forward, "
     "\"other rounds\" the same drafter's eager rounds, both in the same run; warm-up excluded, reported in the files)", [
        ("SmolLM2-135M, GSM8K (10)", "compiled_rounds_smollm2_gsm8k.json", "jetspec-compiled"),
        ("SmolLM2-135M, HumanEval (10)", "compiled_rounds_smollm2_humaneval.json", "jetspec-compiled"),
        ("SmolLM2-135M, MT-Bench (10, both turns)", "compiled_rounds_smollm2_mt-bench.json", "jetspec-compiled"),
        ("Qwen2.5-Coder-1.5B, HumanEval (8)", "compiled_rounds_qwen_humaneval.json", "jetspec-compiled"),
    ]),
    ("Long prompts, SmolLM2-135M, greedy, bf16 (summaries, quotes and code edits; the defaults run chain rounds past 1,024 prompt tokens)", [
        ("long-2k", "long_2k_smollm2_bfloat16.json", "jetspec-chain"),
        ("long-4k", "long_4k_smollm2_bfloat16.json", "jetspec-chain"),
        ("long-8k", "long_8k_smollm2_bfloat16.json", "jetspec-chain"),
    ]),
]

# (table title, [(row label, drafter-alone result file, defaults result file or None)]): streams of items
# in order, the drafter learning online after each item (``jetspec-online``) beside the frozen one
STREAMS = [
    ("Online learning on streams, SmolLM2-135M, greedy, bf16 (shipped drafter version 3; `jetspec-online` learns after every item; "
     "drafter alone: chains, J1, budget 16, policy off; HumanEval with the learner's defaults (top-16 labels, learning rate 1e-4); "
     "GSM8K and GPQA predate them (top-1 labels, 5e-4), GSM8K also the out-of-vocabulary label fix and the guard's significance rule; "
     "defaults: tree rounds under the policy, 6 learning steps after every item, measured on HumanEval only so far)", [
        ("HumanEval (60)", "online_alone_smollm2_humaneval.json", "online_defaults_smollm2_humaneval.json"),
        ("GSM8K (60)", "online_alone_smollm2_gsm8k.json", None),
        ("GPQA-Diamond (60)", "online_alone_smollm2_gpqa.json", None),
    ]),
]

# the front page's rows: (target, prompts, result file, our method), each one of CURRENT's runs
HEADLINE = [
    ("SmolLM2-135M", "GSM8K (10)", "smollm2_v3_defaults_gsm8k_bf16.json", "jetspec"),
    ("SmolLM2-135M", "HumanEval (10)", "smollm2_v3_defaults_humaneval_bf16.json", "jetspec"),
    ("SmolLM2-135M", "MT-Bench (5, both turns)", "smollm2_v3_defaults_mt-bench_bf16.json", "jetspec"),
    ("SmolLM2-135M, compiled rounds", "HumanEval (10)", "compiled_rounds_smollm2_humaneval.json", "jetspec-compiled"),
    ("SmolLM2-135M, T = 0.7", "MT-Bench (20)", "sampling_smollm2_mt-bench_t0.7_lazy_20.json", "jetspec"),
    ("Qwen2.5-Coder-1.5B", "HumanEval (10)", "qwen15_shipped_humaneval_bf16.json", "jetspec-tree-policy"),
    ("Qwen2.5-Coder-1.5B", "MT-Bench coding + reasoning (5)", "qwen15_shipped_mt-bench-code-reasoning_bf16.json", "jetspec-tree-policy"),
    ("Gemma-3-270M, no drafter", "continuations (20)", "drafter_free_compiled_peer_gemma3_continuation.json", "drafter-free"),
]
FRONT_PAGE = HERE.parent / "README.md"
HEAD_START, HEAD_END = "<!-- headline:start -->", "<!-- headline:end -->"

CHAIN = "jetspec-chain"  # the same drafter with chain rounds, where the run measured it


def bench_command(config: dict) -> str:
    """The ``hf-jetspec bench`` line that reproduces a saved run, from its own configuration."""
    parts = ["hf-jetspec bench", f"--target {config['target']}", f"--prompts {config['prompts']}", f"--limit {config['limit']}"]
    if config.get("offset"):
        parts.append(f"--offset {config['offset']}")
    parts += [f"--max-new-tokens {config['max_new_tokens']}", f"--dtype {config['dtype']}", f"--methods {','.join(config['methods'])}"]
    if config.get("temperature"):
        parts.append(f"--temperature {config['temperature']}")
        if config.get("top_p") not in (None, 1.0):
            parts.append(f"--top-p {config['top_p']}")
    if config.get("baseline_drafter"):
        parts.append(f"--baseline-drafter {config['baseline_drafter']}")
    if config.get("policy") is False:
        parts.append("--policy off")
    for key, flag in (("tree", "--tree"), ("jacobi_passes", "--jacobi-passes"), ("budget", "--budget")):
        if config.get(key) is not None:
            parts.append(f"{flag} {config[key]}")
    if "jetspec-online" in config["methods"]:
        parts.append(f"--learn-steps {config['learn_steps']}")
        if config.get("learn_share") is not None:
            parts.append(f"--learn-share {config['learn_share']}")
        parts.append(f"--learn-lr {config['learn_lr']}")
    return " ".join(parts)


def exactness(method: dict, sampled: bool, compiled: bool = False) -> str:
    """The output against plain decoding (``compiled``: against compiled plain decoding, whose kernels
    round as compiled rounds' do)."""
    if sampled:
        return "same law (sampled)"
    suffix = "_vs_ar_compiled" if compiled else "_vs_ar"
    exact, tie = method.get("exact_match" + suffix), method.get("tie_explained" + suffix)
    against = " (vs compiled plain)" if compiled else ""
    if exact == 1.0:
        return "identical" + against
    if tie is not None:
        return f"{exact:.2f} identical, divergences {tie:.0%} tie-explained{against}"
    return f"{exact:.2f} identical{against}"


def other_rounds_column(methods: dict, ours: str, peer) -> str:
    """The same drafter's other rounds in the run: for compiled rounds, the eager ones (``jetspec``);
    otherwise the chain rounds, ``jetspec-chain`` where measured (in runs from before tree rounds became
    the default, ``jetspec`` ran chains)."""
    if ours == "jetspec-compiled":
        return f"eager {peer('jetspec')}"
    if ours == "drafter-free":
        return f"trees {peer('drafter-free-tree')}" if "drafter-free-tree" in methods else "-"
    if ours == "drafter-free-tree":
        return f"chains {peer('drafter-free')}"
    if ours == CHAIN or (ours == "jetspec" and CHAIN not in methods):
        return "(this)"
    return f"chains {peer(CHAIN) if CHAIN in methods else peer('jetspec')}"


def against_best_compiled(method: dict) -> str:
    """The speed against the faster compiled plain path measured in the run: transformers' static-cache
    compiled decoding (``ar-compiled``) or plain steps through the frozen compiled forward
    (``ar-static``, greedy runs), marked with the one it is."""
    peers = {name: method[key] for name, key in (("ar-compiled", "speedup_vs_ar_compiled"), ("ar-static", "speedup_vs_ar_static"))
             if method.get(key) is not None}
    if not peers:
        return "not run"
    name = min(peers, key=peers.get)
    return f"{peers[name]:.2f}x ({name})"


def table(title: str, rows: list[tuple[str, str, str]]) -> list[str]:
    out = [f"**{title}**", "",
           "| prompts | plain tok/s | hf_jetspec | vs best compiled plain | tau | other rounds | prompt lookup | assisted | output vs plain | "
           "machine, date |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    commands = []
    for label, name, ours in rows:
        result = json.loads((RESULTS / name).read_text())
        methods, config, env = result["methods"], result["config"], result.get("environment", {})
        sampled = bool(config.get("temperature"))
        mine = methods[ours]

        def peer(key):
            m = methods.get(key)
            return "-" if m is None else f"{m['speedup_vs_ar']:.2f}x"

        machine = f"{env.get('cpu', '?')}, {env.get('date', '?')[:10]}"
        compiled = against_best_compiled(mine)
        out.append(f"| {label} | {methods['ar']['tokens_per_s']:.1f} | **{mine['speedup_vs_ar']:.2f}x** | {compiled} | {mine['tau']:.2f} | "
                   f"{other_rounds_column(methods, ours, peer)} | {peer('prompt-lookup')} | {peer('assisted')} | "
                   f"{exactness(mine, sampled, compiled=ours == 'jetspec-compiled')} | {machine} |")
        commands.append(f"{bench_command(config)}   # {label}: results/{name}")
    out += ["", "```bash", *commands, "```", ""]
    return out


def stream_table(title: str, rows: list[tuple[str, str, str | None]]) -> list[str]:
    """Online learning on streams: tau over the second half of the items, the drafter alone (frozen and
    learning), then the defaults' speeds with learning time counted, and the learning time's share."""
    out = [f"**{title}**", "",
           "| stream | alone: frozen tau, 2nd half | alone: learning | ratio | defaults: frozen | learning (time included) | "
           "prompt lookup | learning share of wall | output vs plain | machine, date |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    commands = []
    for label, alone_name, defaults_name in rows:
        alone = json.loads((RESULTS / alone_name).read_text())
        frozen, learning = alone["methods"]["jetspec"]["tau_last_half"], alone["methods"]["jetspec-online"]["tau_last_half"]
        env = alone.get("environment", {})
        cells = ["-"] * 5
        if defaults_name is not None:
            result = json.loads((RESULTS / defaults_name).read_text())
            m = result["methods"]
            cells = [f"{m['jetspec']['speedup_vs_ar']:.2f}x", f"**{m['jetspec-online']['speedup_vs_ar']:.2f}x**",
                     f"{m['prompt-lookup']['speedup_vs_ar']:.2f}x", f"{m['jetspec-online']['learn_share_of_wall']:.0%}",
                     exactness(m["jetspec-online"], bool(result["config"].get("temperature")))]
            commands.append(f"{bench_command(result['config'])}   # {label}, defaults: results/{defaults_name}")
        machine = f"{env.get('cpu', '?')}, {env.get('date', '?')[:10]}"
        out.append(f"| {label} | {frozen:.2f} | **{learning:.2f}** | {learning / frozen:.2f} | " + " | ".join(cells) + f" | {machine} |")
        commands.insert(len(commands) - (defaults_name is not None), f"{bench_command(alone['config'])}   # {label}, drafter alone: results/{alone_name}")
    out += ["", "```bash", *commands, "```", ""]
    return out


def page() -> str:
    lines = [
        START,
        "## Current results",
        "",
        "What the shipped drafters give today with their default settings, against plain decoding and",
        "the best peers measured in the same interleaved run (speedups are ratios to plain decoding in",
        "that run). Generated by `python benchmarks/current_results.py` from the files in `results/`",
        "named in its `CURRENT` list; the dated reports in [`docs/reports/`](../docs/reports/README.md) are the history behind each number.",
        "\"vs best compiled plain\" is the speed against the faster of two compiled plain paths measured in the same run:",
        "transformers' plain decoding on a static cache with the compiled forward (`ar-compiled`), and plain greedy steps",
        "through the frozen compiled forward that compiled rounds verify with (`ar-static`, greedy runs only).",
        "",
    ]
    for title, rows in CURRENT:
        lines += table(title, rows)
    for title, rows in STREAMS:
        lines += stream_table(title, rows)
    lines.append(END)
    return "\n".join(lines) + "\n"


def headline() -> str:
    """The front page's table: bf16 on two CPU cores, each row's peers from the same interleaved run."""
    lines = [HEAD_START,
             "| target | prompts | plain tok/s | hf_jetspec | vs best compiled plain | prompt lookup | assisted | output vs plain | machine, date |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for target, label, name, ours in HEADLINE:
        result = json.loads((RESULTS / name).read_text())
        methods, env = result["methods"], result.get("environment", {})
        assisted = methods.get("assisted")
        lines.append(f"| {target} | {label} | {methods['ar']['tokens_per_s']:.1f} | **{methods[ours]['speedup_vs_ar']:.2f}x** | "
                     f"{against_best_compiled(methods[ours])} | "
                     f"{methods['prompt-lookup']['speedup_vs_ar']:.2f}x | {'-' if assisted is None else format(assisted['speedup_vs_ar'], '.2f') + 'x'} | "
                     f"{exactness(methods[ours], bool(result['config'].get('temperature')), compiled=ours == 'jetspec-compiled')} | {env.get('cpu', '?')}, {env.get('date', '?')[:10]} |")
    lines.append(HEAD_END)
    return "\n".join(lines) + "\n"


def with_headline(front: str, table_text: str) -> str:
    if HEAD_START not in front or HEAD_END not in front:
        raise ValueError(f"{FRONT_PAGE} has no {HEAD_START} ... {HEAD_END} block for the headline table")
    head, rest = front.split(HEAD_START, 1)
    return head + table_text.rstrip("\n") + rest.split(HEAD_END, 1)[1]


def with_page(readme: str, new_page: str) -> str:
    """``readme`` with its page replaced (or inserted after the title line)."""
    if START in readme and END in readme:
        head, rest = readme.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        return head + new_page + "\n" + tail
    title, _, body = readme.partition("\n")
    return title + "\n\n" + new_page + "\n" + body.lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's page differs from the result files")
    args = ap.parse_args(argv)
    readme = README.read_text()
    updated = with_page(readme, page())
    front = FRONT_PAGE.read_text()
    front_updated = with_headline(front, headline())
    if args.check:
        if updated != readme or front_updated != front:
            print("the current-results page (benchmarks/README.md) or the headline table (README.md) is stale: "
                  "run python benchmarks/current_results.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(updated)
    FRONT_PAGE.write_text(front_updated)
    print(f"wrote the current-results page of {README} and the headline table of {FRONT_PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
