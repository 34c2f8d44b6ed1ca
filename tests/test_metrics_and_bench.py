"""evaluate metric modules on hand-made inputs; the bench JSON schema on a tiny run."""

import json

import evaluate
import pytest
import torch

from hf_jetspec import metrics


def test_metrics_load_offline_and_compute():
    acc = metrics.load("acceptance_length")
    out = acc.compute(committed_tokens=[10, 5], rounds=[4, 1], accepted_lengths=[[0, 2, 3, 1], [4]])
    assert out == {"tau": 3.0, "rounds": 5, "committed_tokens": 15, "accept_length_hist": [1, 1, 1, 1, 1]}
    sp = evaluate.load(metrics.path("speedup")).compute(tokens=[100, 50], seconds=[2.0, 1.0], baseline_tokens=[100, 50], baseline_seconds=[4.0, 2.0])
    assert sp["speedup"] == pytest.approx(2.0) and sp["tokens_per_s"] == pytest.approx(50.0)
    em = metrics.load("exact_match").compute(predictions=[[1, 2], [3], [5, 6]], references=[[1, 2], [4], [5]])
    assert em["exact_match"] == pytest.approx(1 / 3) and em["mismatches"] == [1, 2]
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.path("bleu")


@pytest.mark.slow
def test_bench_schema(tmp_path):
    from hf_jetspec.tools.bench import BenchConfig, markdown_table, run_bench

    out = tmp_path / "r.json"
    cfg = BenchConfig(prompts="mt-bench", limit=1, max_new_tokens=8, methods=("ar", "prompt-lookup", "jetspec"), warmup_tokens=4, output=str(out),
                      dtype="float32")
    result = run_bench(cfg, progress=False)
    saved = json.loads(out.read_text())
    assert saved["methods"].keys() == {"ar", "prompt-lookup", "jetspec"} and (tmp_path / "r.png").is_file()
    keys = {"tokens_per_s", "tau", "speedup_vs_ar", "exact_match_vs_ar", "rounds", "accept_length_hist", "draft_time_s", "verify_time_s", "peak_memory_mb"}
    for name, m in saved["methods"].items():
        assert keys <= m.keys(), name
        assert m["exact_match_vs_ar"] == 1.0  # greedy: every method reproduces AR
    assert saved["methods"]["ar"]["tau"] is None and saved["methods"]["jetspec"]["tau"] >= 1.0
    assert saved["methods"]["jetspec"]["draft_time_s"] > 0
    assert saved["config"]["num_items"] == 2  # both MT-Bench turns
    assert all(len(m["seconds_per_item"]) == 2 and sum(m["seconds_per_item"]) == pytest.approx(m["seconds"]) for m in saved["methods"].values())
    assert {"torch", "transformers", "device", "threads"} <= saved["environment"].keys()
    assert "| jetspec |" in markdown_table(result)
    assert saved["config"]["target_dtype"] == "float32" and "native_bf16" in saved["environment"]
    jet = saved["methods"]["jetspec"]
    assert sum(jet["source_counts"].values()) == jet["rounds"] and jet["cost_model"]["verify_ms"]
    assert saved["methods"]["jetspec"]["divergences"] == [] and saved["methods"]["jetspec"]["tie_explained_vs_ar"] is None
    for m in saved["methods"].values():  # prefill and decoding apart: the first chunk comes before the end of each generation
        assert all(0 < f < s for f, s in zip(m["first_chunk_s_per_item"], m["seconds_per_item"])) and m["decode_tokens_per_s"] > 0
    assert saved["methods"]["ar"]["first_chunk_tokens_per_item"] == [1, 1] and saved["methods"]["ar"]["decode_speedup_vs_ar"] == 1.0
    with pytest.raises(ValueError, match="unknown method"):
        BenchConfig(methods=("ar", "medusa"))


def test_bench_drafter_free_variants_are_exact_and_tree_rounds_are_switchable(tmp_path):
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    methods = ("ar", "drafter-free", "drafter-free-tree")
    cfg = BenchConfig(prompts="humaneval", limit=1, max_new_tokens=24, methods=methods, warmup_tokens=4, output=str(tmp_path / "r.json"),
                      dtype="float32")
    run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "r.json").read_text())["methods"]
    assert all(saved[m]["exact_match_vs_ar"] == 1.0 for m in methods)
    assert saved["drafter-free"]["drafting_config"]["tree"] is False and saved["drafter-free-tree"]["drafting_config"]["tree"] is True
    assert "ngram-tree" not in saved["drafter-free"]["source_counts"]
    auto = BenchConfig(prompts="humaneval", limit=1, max_new_tokens=8, methods=("ar", "drafter-free"), warmup_tokens=4, tree="auto",
                       output=str(tmp_path / "auto.json"), dtype="float32")
    run_bench(auto, progress=False)
    assert json.loads((tmp_path / "auto.json").read_text())["methods"]["drafter-free"]["drafting_config"]["tree"] is True


def test_decode_rate_counts_tokens_and_time_after_the_first_chunk():
    from hf_jetspec.tools.bench import decode_rate

    assert decode_rate([11, 21], [3.0, 5.0], [1, 1], [1.0, 1.0]) == 5.0  # 30 tokens in 6 s
    assert decode_rate([4], [2.0], [4], [2.0]) == 0.0  # everything came in the first chunk: no decoding phase


@pytest.mark.slow
def test_bench_baseline_drafter_runs_beside_jetspec(tmp_path):
    """``jetspec-baseline`` generates with the second drafter (its own statistics), in the same run."""
    from hf_jetspec import JetSpecDrafter, load_target
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    target, _ = load_target("smollm2-135m", dtype="float32")
    JetSpecDrafter.for_target(target).save_pretrained(tmp_path / "untrained")
    cfg = BenchConfig(prompts="gsm8k", limit=1, max_new_tokens=16, methods=("ar", "jetspec", "jetspec-baseline"), warmup_tokens=4,
                      dtype="float32", policy=False, baseline_drafter=str(tmp_path / "untrained"))
    m = run_bench(cfg, progress=False)["methods"]
    assert m["jetspec"]["drafter"] == "drafter hub_cards/jetspec-smollm2-135m"
    assert m["jetspec-baseline"]["drafter"].endswith("untrained")
    assert m["jetspec"]["exact_match_vs_ar"] == m["jetspec-baseline"]["exact_match_vs_ar"] == 1.0
    assert m["jetspec-baseline"]["drafting_config"]["policy"] is False  # the bench's options apply to both drafters
    # the untrained drafter's full blocks are rarely accepted: its own statistics, not the shipped drafter's
    assert m["jetspec-baseline"]["tau"] < m["jetspec"]["tau"]
    with pytest.raises(ValueError, match="go together"):
        BenchConfig(methods=("ar", "jetspec-baseline"))
    with pytest.raises(ValueError, match="go together"):
        BenchConfig(methods=("ar", "jetspec"), baseline_drafter="x")


@pytest.mark.slow
def test_bench_online_method_learns_on_its_own_drafter_in_stream_order(tmp_path):
    """``jetspec-online`` learns after every item on its own drafter copy: the frozen ``jetspec`` drafter
    keeps its weights, outputs stay the target's, tau is reported per item and over the second half."""
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    out = tmp_path / "online.json"
    cfg = BenchConfig(prompts="gsm8k", limit=2, max_new_tokens=24, methods=("ar", "jetspec", "jetspec-online"), warmup_tokens=4,
                      dtype="float32", policy=False, learn_steps=2, output=str(out))
    result = run_bench(cfg, progress=False)
    m = result["methods"]
    online, frozen = m["jetspec-online"], m["jetspec"]
    assert online["exact_match_vs_ar"] == frozen["exact_match_vs_ar"] == 1.0
    assert len(online["tau_per_item"]) == len(frozen["tau_per_item"]) == 2 and online["tau_last_half"] == pytest.approx(online["tau_per_item"][1], abs=1e-4)
    learner = online["learner"]
    assert learner["steps"] == 4 and learner["kept_calls"] == 2 and learner["weight_swaps"] == 2  # no learning from the warm-up
    assert len(online["learn_seconds_per_item"]) == 2 and 0 < online["learn_share_of_wall"] < 1
    assert online["online_learning"]["steps_per_call"] == 2 and "learner" not in frozen
    assert (tmp_path / "online_tau.png").is_file()


@pytest.mark.slow
def test_bench_int8_variant_compiles_in_warmup_and_stays_exact():
    """``jetspec-int8`` drafts through the compiled step in int8; its graphs compile in the warm-up, not
    in the timed runs, and its output is the target's."""
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    cfg = BenchConfig(prompts="gsm8k", limit=1, max_new_tokens=16, methods=("ar", "jetspec", "jetspec-int8"), warmup_tokens=4,
                      dtype="float32", policy=False)
    m = run_bench(cfg, progress=False)["methods"]
    assert m["jetspec-int8"]["drafting_config"]["int8"] is True and m["jetspec-int8"]["drafting_config"]["compile"] is True
    assert m["jetspec"]["drafting_config"]["int8"] is False
    assert m["jetspec-int8"]["compile_warmup_s"] > 0 and "compile_warmup_s" not in m["jetspec"]
    assert m["jetspec-int8"]["exact_match_vs_ar"] == m["jetspec"]["exact_match_vs_ar"] == 1.0
    assert m["jetspec-int8"]["tau"] > 1.0


@pytest.mark.slow
def test_bench_compiled_methods_compare_like_with_like():
    """``ar-compiled``, ``ar-static`` and ``jetspec-compiled`` beside ``ar`` (fp32, traced with the eager
    backend): every output is plain decoding's, the compiled rounds' record is their own runner's, and
    no graph compiles in the timed runs."""
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    cfg = BenchConfig(prompts="gsm8k", limit=1, max_new_tokens=12, methods=("ar", "ar-compiled", "ar-static", "jetspec-compiled"),
                      warmup_tokens=4, dtype="float32", budget=8, compile_backend="eager")
    m = run_bench(cfg, progress=False)["methods"]
    assert all(m[name]["exact_match_vs_ar"] == 1.0 for name in ("ar-compiled", "ar-static", "jetspec-compiled"))
    assert m["jetspec-compiled"]["exact_match_vs_ar_compiled"] == 1.0 and m["jetspec-compiled"]["speedup_vs_ar_static"] > 0
    record = m["jetspec-compiled"]["static_target"]
    assert record["graphs_after_runs"] == record["graphs_after_warmup"] and set(record["bucket_ms"]) == {"1", "8"}
    assert record["read_layers"]  # the rounds' runner, not ar-static's (which reads no hidden states)
    assert m["ar-compiled"]["tau"] is None and m["ar-static"]["compile_warmup_s"] > 0
    with pytest.raises(ValueError, match="decodes greedily"):
        BenchConfig(methods=("ar", "ar-static"), temperature=0.7)


@pytest.mark.slow
def test_bench_bf16_scores_divergences():
    """`bench --dtype bfloat16` writes the tie margin, the divergences and the tie-explained share per method."""
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    cfg = BenchConfig(prompts="gsm8k", limit=1, max_new_tokens=12, methods=("ar", "jetspec", "jetspec-fixed"), warmup_tokens=4,
                      dtype="bfloat16", tie_margin_items=1)
    result = run_bench(cfg, progress=False)
    assert result["config"]["dtype"] == "bfloat16" and result["config"]["target_dtype"] == "bfloat16"
    assert result["numerics"]["tie_margin"] > 0 and result["numerics"]["noise_positions"] > 0
    for name in ("jetspec", "jetspec-fixed"):
        m = result["methods"][name]
        assert isinstance(m["divergences"], list) and 0.0 <= m["tie_explained_vs_ar"] <= 1.0
        for d in m["divergences"]:
            assert {"prompt_index", "position", "ar_token", "method_token", "fp32_margin"} <= d.keys()
    assert result["methods"]["jetspec-fixed"]["drafting_config"]["policy"] is False
    assert result["methods"]["jetspec"]["drafting_config"]["policy"] is True


@pytest.mark.slow
def test_bench_with_shipped_foresight_adapter():
    """`bench --foresight --cache-size 4 --context-refreshes 1` with the adapter shipped for SmolLM2."""
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    cfg = BenchConfig(prompts="gsm8k", limit=1, max_new_tokens=24, methods=("ar", "jetspec"), warmup_tokens=4, dtype="float32",
                      foresight=True, cache_size=4, context_refreshes=1, jacobi_passes=1)
    m = run_bench(cfg, progress=False)["methods"]["jetspec"]
    assert m["exact_match_vs_ar"] == 1.0
    assert m["hit_rate"] is not None and 0.0 <= m["hit_rate"] <= 1.0
    assert m["calibrated"] is True and m["adapter"].endswith("jetspec-smollm2-135m-foresight-layerskip")
    assert m["exposed_draft_ms_per_round"] > 0 and m["context_refreshes"] > 0


def test_acceptance_on_items_restores_options(trained_llama):
    from hf_jetspec.training.drafter_tau import acceptance_on_items

    target, drafter, prompts = trained_llama
    before = drafter.drafting_config
    refs: dict = {}
    items = [(str(i), prompts[i : i + 1]) for i in range(2)]
    r = acceptance_on_items(target, drafter, items, 24, refs, num_jacobi_passes=2, budget=8)
    assert r["exact"] and r["tau"] > 1.0 and r["rounds"] > 0
    assert set(refs) == {"0", "1"}  # AR references cached for the next call
    # every round reaches position 1 but an item's last, which may have no room left to draft; tau is one plus the
    # accepted positions per round (budget 8: 7 drafted positions)
    pos = r["position_acceptance"]
    assert len(pos) == 7 and r["rounds"] - len(items) <= pos[0][0] <= r["rounds"] and all(a <= n for n, a in pos)
    assert 1 + sum(a for _, a in pos) / r["rounds"] == pytest.approx(r["tau"], abs=0.05)
    assert drafter.drafting_config == before


def test_acceptance_on_items_measures_full_blocks_unless_asked_for_trees(trained_llama):
    from hf_jetspec.training.drafter_tau import acceptance_on_items

    target, drafter, prompts = trained_llama
    before = drafter.drafting_config
    items = [("0", prompts[:1])]
    try:
        drafter.drafting_config = before.replace(tree="auto")  # a saved checkpoint's options may ask for trees
        acceptance_on_items(target, drafter, items, 24, policy=False)
        assert not drafter.generation_stats.tree_nodes  # chain rounds: the drafter alone
        r = acceptance_on_items(target, drafter, items, 24, policy=False, tree="auto")
        assert drafter.generation_stats.tree_nodes and r["exact"]
    finally:
        drafter.drafting_config = before


def test_bench_items_past_the_target_context_are_refused(llama_target):
    from hf_jetspec.tools.bench import build_items
    from hf_jetspec.data import EvalPrompt

    class WordTokenizer:  # one token per word, no chat template
        chat_template = None

        def __call__(self, text, return_tensors=None):
            return {"input_ids": torch.arange(len(text.split()))[None] % 100}

    limit = llama_target.config.max_position_embeddings
    fits = EvalPrompt("fits", (" ".join(["w"] * (limit - 10)),), "local")
    assert build_items(WordTokenizer(), llama_target, [fits], 10)[0][1].shape[1] == limit - 10
    with pytest.raises(ValueError, match="exceed the target's .*-position context: lower --max-new-tokens"):
        build_items(WordTokenizer(), llama_target, [fits], 11)


def test_dump_json_keeps_objects_indented_and_value_lists_on_one_line():
    from hf_jetspec.tools.bench import dump_json

    data = {"m": {"outputs": [[1, 2, 3], [4]], "tau": 1.5, "hist": [0, 2], "none": None, "empty": {}}, "items": ["a", "b"]}
    text = dump_json(data)
    assert json.loads(text) == data and text.endswith("}\n")
    assert '"hist": [0, 2]' in text and '"items": ["a", "b"]' in text and "  [1, 2, 3],\n" in text


def test_acceptance_on_items_lists_divergent_items_and_they_score_in_fp32(trained_llama):
    """An item whose output differs from the (here: doctored) reference is listed with both token
    lists; its fp32 margin is the target's logit gap of the two tokens on the reference's prefix, and
    it counts as a tie only within the margin given."""
    from hf_jetspec.tools.numerics import score_item_divergences
    from hf_jetspec.training.drafter_tau import acceptance_on_items

    target, drafter, prompts = trained_llama
    items = [(str(i), prompts[i : i + 1]) for i in range(2)]
    refs: dict = {}
    assert acceptance_on_items(target, drafter, items, 12, refs)["divergent"] == []
    n = prompts.shape[1]
    true_output = refs["1"][0, n:].tolist()
    with torch.no_grad():
        logits = target(refs["1"][:, : n + 3]).logits[0, -1].float()
    runner_up = int(logits.topk(2).indices[1])
    doctored = refs["1"].clone()
    doctored[0, n + 3] = runner_up  # the "reference" takes the runner-up at its 4th token
    refs["1"] = doctored
    r = acceptance_on_items(target, drafter, items, 12, refs)
    assert not r["exact"] and [d["item"] for d in r["divergent"]] == ["1"]
    assert r["divergent"][0]["output"] == true_output and r["divergent"][0]["reference"][3] == runner_up
    gap = float(logits[runner_up] - logits[true_output[3]])  # reference token minus output token: negative
    scored = score_item_divergences(target, items, r["divergent"], tie_margin=abs(gap) + 1e-3)
    (d,) = scored["divergences"]
    assert d["prompt_index"] == "1" and d["position"] == 3 and abs(d["fp32_margin"] - gap) < 1e-4
    assert scored["tie_explained"] == 1.0
    assert score_item_divergences(target, items, r["divergent"], tie_margin=abs(gap) / 2)["tie_explained"] == 0.0


def test_regeneration_profile_shares_on_hand_numbers():
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "regeneration_throughput.py"
    spec = importlib.util.spec_from_file_location("regeneration_throughput", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    op = lambda key, us, count: SimpleNamespace(key=key, self_cpu_time_total=us, count=count)  # noqa: E731
    averages = [op("aten::mul", 100.0, 4), op("aten::mm", 600.0, 3), op("aten::cat", 100.0, 1),
                op("aten::_scaled_dot_product_flash_attention_for_cpu", 200.0, 2)]
    got = module.operator_profile(averages, seconds=2.5, top=2)
    assert got["seconds"] == 2.5 and got["self_cpu_seconds"] == 0.0
    assert got["kinds"] == {"matrix products": 0.6, "attention": 0.2, "copies": 0.1, "other": 0.1}
    assert got["operators"] == [{"name": "aten::mm", "share": 0.6, "calls": 3, "ms_per_call": 0.2},
                                {"name": "aten::_scaled_dot_product_flash_attention_for_cpu", "share": 0.2, "calls": 2, "ms_per_call": 0.1}]


def test_bench_batches_rows_in_file_order_and_says_what_cannot_batch(tmp_path):
    """--batch-size 2 over 3 items: batches [0, 1] and [2]; the drafter-free rows equal transformers'
    batched plain rows; methods that cannot run on several rows say why instead of running."""
    from hf_jetspec.tools.bench import BenchConfig, run_bench

    cfg = BenchConfig(prompts="humaneval", limit=3, max_new_tokens=24,
                      methods=("ar", "prompt-lookup", "drafter-free", "jetspec", "jetspec-batch-tree", "jetspec-int8"),
                      warmup_tokens=4, output=str(tmp_path / "b.json"), dtype="float32", batch_size=2)
    run_bench(cfg, progress=False)
    saved = json.loads((tmp_path / "b.json").read_text())
    m = saved["methods"]
    assert saved["config"]["batch_size"] == 2 and saved["config"]["num_items"] == 3
    assert len(m["ar"]["outputs"]) == len(m["drafter-free"]["outputs"]) == len(m["jetspec"]["outputs"]) == 3
    for name in ("drafter-free", "jetspec", "jetspec-batch-tree"):  # fp32: every row is batched plain decoding's
        assert m[name]["exact_match_vs_ar"] == 1.0 and m[name]["tokens_per_s"] > 0 and m[name]["tau"] >= 1.0, name
    assert "refuses more than one row" in m["prompt-lookup"]["unavailable"] and "one row at a time" in m["jetspec-int8"]["unavailable"]
    assert "tokens_per_s" not in m["prompt-lookup"]
