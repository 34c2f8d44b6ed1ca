"""dtype plumbing: names, native-bf16 detection, ``auto``, and drafters/adapters following their target."""

import pytest
import torch

from hf_jetspec import JetSpecDrafter
from hf_jetspec.tools.dtypes import describe_capability, native_bf16_flags, resolve_dtype
from helpers import tiny_llama

CPUINFO_EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
CPUINFO_AMX = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile avx512_bf16\n"
CPUINFO_OLD = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"


def test_native_bf16_flags_from_cpuinfo():
    assert native_bf16_flags(CPUINFO_EPYC) == ["avx512_bf16"]
    assert native_bf16_flags(CPUINFO_AMX) == ["avx512_bf16", "amx_bf16"]
    assert native_bf16_flags(CPUINFO_OLD) == []
    assert native_bf16_flags("") == []


def test_resolve_dtype_names_and_errors():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("FP16") is torch.float16
    assert resolve_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="unknown dtype 'bfloat17'"):
        resolve_dtype("bfloat17")
    with pytest.raises(ValueError, match="unsupported dtype"):
        resolve_dtype(torch.int8)


def test_auto_follows_the_hardware(monkeypatch):
    import hf_jetspec.tools.dtypes as d

    monkeypatch.setattr(d, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert resolve_dtype("auto") is torch.bfloat16
    assert describe_capability("cpu") == {"native_bf16": True, "cpu_bf16_flags": ["avx512_bf16"]}
    monkeypatch.setattr(d, "cpu_bf16_flags", lambda: ())
    assert resolve_dtype("auto") is torch.float32  # emulated bf16 is slower than fp32: never auto
    assert resolve_dtype(None) is torch.float32


def test_drafter_follows_its_target_dtype():
    target = tiny_llama()
    drafter = JetSpecDrafter.for_target(target).eval()  # fresh drafters keep fp32 (master weights)
    bf16_target = tiny_llama().to(torch.bfloat16)
    drafter.attach_target(bf16_target)
    assert drafter.dtype == torch.bfloat16
    prompt = torch.randint(0, 128, (1, 6))
    out = bf16_target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=12)
    assert out.shape[1] == 18
    keep = JetSpecDrafter.for_target(target)
    keep.attach_target(bf16_target, follow_dtype=False)  # training: fp32 weights beside a bf16 target
    assert keep.dtype == torch.float32


def test_load_target_rejects_bad_dtype():
    from hf_jetspec import load_target

    with pytest.raises(ValueError, match="unknown dtype"):
        load_target("smollm2-135m", dtype="half-precision-please")


def test_environment_names_the_cpu_and_the_capability(tmp_path):
    from hf_jetspec.tools.environment import cpu_name, describe_environment

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: avx512_bf16\n")
    assert cpu_name(info).startswith("Test CPU 9000 (")
    assert cpu_name(tmp_path / "missing").endswith(" cores)")
    env = describe_environment(torch.device("cpu"))
    assert env["threads"] == torch.get_num_threads() and env["torch"] == torch.__version__
    assert env["device"] == "cpu" and env["date"].endswith(" UTC")
    assert set(describe_capability(torch.device("cpu"))) <= set(env)
