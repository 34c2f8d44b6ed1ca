"""The drafting engine: preallocated caches, mask and rotary tables, sparse decoder rows, batched refinement,
and a package whose modules import alone, without a cycle through the drafter and foresight."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import verified_context

from hf_jetspec.drafter.drafter_cache import BlockAttention, DrafterCache
from hf_jetspec.foresight.calibration import ForesightCalibration, anchor_candidates, decoder_position_stats
from hf_jetspec.foresight.outcomes import TopRows, outcome_scores, rank_outcomes, select_top_outcomes, top_outcomes
from hf_jetspec.drafter.layers import RMSNorm, RotaryTable, rotary_cos_sin
from hf_jetspec.kernels import log_normaliser
from hf_jetspec.drafter.masks import context_block_mask, prefix_block_mask

SRC = Path(__file__).resolve().parents[1] / "src"


# ------------------------------------------------------------------ caches and tables
def test_prefix_block_mask_hand_checked():
    # capacity 3, blocks of 2 rows: entry (i, t) = t <= 3 + i
    assert prefix_block_mask(2, 3).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    # after C = 1 context row: the last 1 + 2 columns: row 0 sees the context and itself, row 1 everything
    assert prefix_block_mask(2, 3)[:, 3 - 1 :].int().tolist() == [[1, 1, 0], [1, 1, 1]]


def test_cache_grows_writes_by_index_and_matches_concatenation():
    torch.manual_seed(0)
    cache = DrafterCache(2, capacity=4)
    ref_k, ref_v = [], []
    for t in (3, 2, 300):  # forces growth past the initial capacity
        k, v = torch.randn(1, 2, t, 8), torch.randn(1, 2, t, 8)
        for i in range(2):
            cache.append(i, k + i, v - i)
        ref_k.append(k)
        ref_v.append(v)
    assert len(cache) == 305 and cache.capacity >= 305
    keys, values = cache.layer(1)
    assert torch.equal(keys, torch.cat(ref_k, 2) + 1) and torch.equal(values, torch.cat(ref_v, 2) - 1)
    # block rows go into scratch space after the context and do not count as context
    bk, bv = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    full_k, full_v = cache.block_keys(0, bk, bv)
    assert torch.equal(full_k, torch.cat([torch.cat(ref_k, 2), bk], 2)) and torch.equal(full_v[:, :, -5:], bv)
    assert len(cache) == 305
    cache.crop(4)
    assert len(cache) == 4 and torch.equal(cache.layer(0)[0], torch.cat(ref_k, 2)[:, :, :4])
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(5)


def test_block_attention_fast_path_equals_general_path():
    torch.manual_seed(1)
    cache = DrafterCache(1)
    cache.append(0, torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8))
    fast = BlockAttention(cache, 1, 4, None, True, "cpu")
    assert fast.fast
    assert torch.equal(fast.mask, context_block_mask(1, 4, 7, None, True, "cpu"))
    k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    general = BlockAttention(cache, 1, 4, ([(torch.randn(1, 2, 0, 8), torch.randn(1, 2, 0, 8))], torch.ones(1, 0, dtype=torch.bool)), True, "cpu")
    assert not general.fast
    for a, b in zip(fast.keys(0, k, v), general.keys(0, k, v)):
        assert torch.equal(a, b)
    assert BlockAttention(cache, 1, 4, None, False, "cpu").mask is None  # bidirectional: nothing masked


def test_rotary_table_equals_direct_computation():
    table = RotaryTable(head_dim=8, theta=10000.0, capacity=4)
    positions = torch.tensor([[0, 5, 17], [3, 3, 9]])  # beyond the initial capacity: the table grows
    for dtype in (torch.float32, torch.bfloat16):
        cos, sin = table(positions, dtype)
        ref_cos, ref_sin = rotary_cos_sin(positions, 8, 10000.0, dtype)
        assert cos.dtype == dtype and torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)


def test_rms_norm_hand_checked():
    norm = RMSNorm(2, eps=0.0)
    norm.weight.data = torch.tensor([1.0, 2.0])
    x = torch.tensor([[3.0, 4.0]])  # rms = sqrt((9 + 16) / 2) = 5 / sqrt(2)
    expected = torch.tensor([[3.0, 8.0]]) * (2**0.5) / 5
    assert torch.allclose(norm(x), expected)


# ------------------------------------------------------------------ sparse decoder rows
def test_log_normaliser_without_float_copy():
    logits = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    assert log_normaliser(logits).tolist() == pytest.approx([0.6931472, 3.126928])  # log 2; 3 + log(1 + e^-2)
    big = (torch.randn(4, 5000) * 6).bfloat16()
    assert torch.allclose(log_normaliser(big), torch.logsumexp(big.float(), -1), atol=5e-3)


def test_top_rows_match_dense_rows_and_selection():
    torch.manual_seed(2)
    logits = torch.randn(6, 50) * 3
    draft = torch.tensor([4, 9, 9, 1, 0])
    probs = torch.softmax(logits, -1)
    sparse = TopRows.from_logits(logits, draft, top=10)
    dense = TopRows.from_probs(probs, draft)
    assert torch.allclose(sparse.probs, dense.probs[:, :10], atol=1e-6) and torch.equal(sparse.ids, dense.ids[:, :10])
    assert torch.allclose(sparse.draft_probs, probs[:5].gather(-1, draft[:, None]).squeeze(-1), atol=1e-6)
    for b in (1, 4, 9):
        assert top_outcomes(sparse, draft, b) == select_top_outcomes(outcome_scores(probs, draft), b)
    for got, ref in zip(decoder_position_stats(sparse, draft), decoder_position_stats(probs, draft)):
        assert torch.allclose(got.float(), ref.float(), atol=1e-6)
    cal = ForesightCalibration(weights=[0.3, 0.8, 0.1, -0.2, 0.1, 0.5], beta=0.8, top_candidates=5)
    feats = torch.randn(5, 6)
    assert cal.select(feats, TopRows.from_logits(logits, draft, 6), draft, 4) == cal.select(feats, probs, draft, 4)


def test_rank_outcomes_ties_and_threshold():
    scored = [(0.2, 1, 7), (0.5, 0, 3), (0.2, 0, 9), (0.2, 0, 2), (0.01, 2, 1)]
    assert rank_outcomes(scored, 3) == [(0, 3), (0, 2), (0, 9)]  # ties: smaller k, then smaller id
    assert rank_outcomes(scored, 10, threshold=0.1) == [(0, 3), (0, 2), (0, 9), (1, 7)]


def test_anchor_candidates_dense_hand_checked():
    toks, probs = anchor_candidates(torch.tensor([0.5, 0.3, 0.2, 0.0]), excluded=0, beta=1.0)
    assert toks.tolist() == [1, 2] and probs.tolist() == pytest.approx([0.6, 0.4])


# ------------------------------------------------------------------ batched foresight refinement
def test_batched_refine_equals_block_by_block(trained_llama):
    from hf_jetspec import DraftingConfig
    from hf_jetspec.foresight import ForesightAdapter, ForesightDecoder, ForesightEngine

    target, drafter, prompts = trained_llama
    options = DraftingConfig(budget=8, num_jacobi_passes=2, num_context_refreshes=2, foresight=True, cache_size=4)
    adapter = ForesightAdapter.for_drafter(drafter, layers_per_module=1).eval()
    engine = ForesightEngine(drafter, adapter, ForesightDecoder(target, max(drafter.config.target_layer_ids)), None, options)
    n = 20
    seq, out, cache = verified_context(target, drafter, prompts[:1], n)
    states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    engine.observe(states, out.hidden_states, n, torch.arange(n))
    tokens = seq[n - 1 : n + 7].clone()  # anchor + 7 tokens: a block under verification
    rows = engine.score(tokens, n - 1).rows
    ks, anchors = torch.tensor([0, 2, 5, 7]), torch.tensor([3, 11, 40, 5])
    starts = n - 1 + ks + 1
    blocks = torch.cat([anchors[:, None], torch.randint(0, 128, (4, 7), generator=torch.Generator().manual_seed(0))], 1)
    logits = torch.randn(4, 7, 128)
    batch_tokens, batch_logits = engine.refine_outcomes(cache, blocks, starts, logits, rows, ks, 2, 2)
    for b in range(4):
        one, one_logits = engine.refine(cache, blocks[b], int(starts[b]), logits[b], 2, 2, context_rows=rows.head(int(ks[b]) + 1))
        assert torch.equal(batch_tokens[b], one), f"block {b}"
        assert torch.allclose(batch_logits[b], one_logits, atol=1e-4)


# ------------------------------------------------------------------ the package's import graph
def _package_modules():
    root = SRC / "hf_jetspec"
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if "metrics" in parts and parts[-1] != "metrics":
            continue  # evaluate metric scripts are loaded by path, not imported
        yield ".".join(parts)


FORK_IMPORTS = """
import importlib, os, sys, traceback

def third_party_modules():
    # the modules outside the package that importing all of it loads (found in a throwaway child)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        before = set(sys.modules)
        for name in sys.argv[1:]:
            try:
                importlib.import_module(name)
            except BaseException:
                pass
        new = [m for m in sys.modules if m not in before and not m.startswith("hf_jetspec")]
        os.write(w, chr(10).join(new).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode().split(chr(10))

for name in third_party_modules():  # shared by every child below, so each pays only for the package itself
    try:
        importlib.import_module(name)
    except BaseException:
        pass
assert not any(m.startswith("hf_jetspec") for m in sys.modules)
failed = []
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a fresh child: nothing of the package imported before this module
        os.close(r)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(w, traceback.format_exc()[-1500:].encode())
            code = 1
        os._exit(code)
    os.close(w)
    err = os.read(r, 4000).decode()
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(name + ": " + err)
print("FAILED" if failed else "OK")
print(chr(10).join(failed))
"""


def test_every_module_imports_alone():
    """Each module of the package imports in a process where no other module of it was imported first
    (children forked from one interpreter that holds only the third-party modules the package uses)."""
    proc = subprocess.run([sys.executable, "-c", FORK_IMPORTS, *_package_modules()], capture_output=True, text=True, cwd=SRC)
    assert proc.returncode == 0 and proc.stdout.startswith("OK"), proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_import_cycle_through_drafter_and_foresight():
    """At import time neither side reaches the other, directly or through other modules: foresight and the
    drafter both sit on the low modules (``target_info``, ``masks``, ``drafter_cache``, ``layers``)."""
    graph = {m: _direct_imports(m) for m in _package_modules()}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt in graph and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    foresight = [m for m in graph if m.startswith("hf_jetspec.foresight.")]
    assert foresight
    for module in foresight:
        assert "hf_jetspec.drafter.modeling_drafter" not in reach(module), module
    assert not any(m.startswith("hf_jetspec.foresight") for m in reach("hf_jetspec.drafter.modeling_drafter"))
    assert "hf_jetspec.drafter.target_info" in reach("hf_jetspec.drafter.modeling_drafter")


def _direct_imports(module: str) -> set[str]:
    """Package modules a module imports at its top level (imports inside functions run later, not at import time).
    The package ``hf_jetspec`` itself is left out: every module's parent package runs first anyway."""
    import ast

    path = SRC / Path(*module.split("."))
    path = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
    tree = ast.parse(path.read_text())
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("hf_jetspec.")}


# ------------------------------------------------------------------ the optional compiled step
def test_compiled_step_drafts_like_eager_and_stays_exact(trained_llama):
    from hf_jetspec import DraftingConfig, JetSpecDrafter

    target, drafter, prompts = trained_llama
    compiled = JetSpecDrafter(drafter.config.__class__(**drafter.config.to_dict()))
    compiled.load_state_dict(drafter.state_dict())
    compiled.attach_target(target)
    compiled.compile_drafting()
    n = 14
    seq, _, eager_cache = verified_context(target, drafter, prompts[:1], n, new_tokens=12)
    caches = [eager_cache, verified_context(target, compiled, prompts[:1], n, new_tokens=12)[2]]
    block = seq[n - 1 : n + 6]
    eager_ids, eager_logits = drafter.draft_block(caches[0], block, n - 1, return_logits=True)
    ids, logits = compiled.draft_block(caches[1], block, n - 1, return_logits=True)
    assert compiled.__dict__["_compiled_step"].calls == 1  # the compiled path really ran
    assert torch.equal(ids, eager_ids) and torch.allclose(logits, eager_logits, atol=1e-4)
    short = seq[n - 1 : n + 3]  # a shorter block runs padded through the graph already compiled
    eager_ids, eager_logits = drafter.draft_block(caches[0], short, n - 1, return_logits=True)
    ids, logits = compiled.draft_block(caches[1], short, n - 1, return_logits=True)
    step = compiled.__dict__["_compiled_step"]
    assert step.calls == 2 and step.lengths == {7} and logits.shape == eager_logits.shape
    assert torch.equal(ids, eager_ids) and torch.allclose(logits, eager_logits, atol=1e-4)
    compiled.drafting_config = DraftingConfig(budget=8, num_jacobi_passes=1, compile=True)
    ref = target.generate(prompts[:2], do_sample=False, max_new_tokens=24)
    for i in range(2):
        assert torch.equal(target.generate(prompts[i : i + 1], assistant_model=compiled, do_sample=False, max_new_tokens=24), ref[i : i + 1])
