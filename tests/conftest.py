import os

# Tests never reach the Hugging Face Hub: every model they load is local or embedded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import tiny_llama, tiny_qwen2, train_drafter_on_greedy  # noqa: E402

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


def pytest_configure(config):
    config.addinivalue_line("markers", "measured_costs: the round policy prices rounds with the machine's own timings")
    if hasattr(config, "workerinput"):  # one of `pytest -n N`'s workers: the cores are shared out between them
        torch.set_num_threads(1)


def real_target_of(item) -> str | None:
    """The embedded target a test loads, if any: the ``smollm2`` fixture, or a ``slow`` test (they load
    SmolLM2-135M, or Qwen2.5-Coder-1.5B where the test id names it); the install check loads none."""
    if "smollm2" in getattr(item, "fixturenames", ()):
        return "smollm2-135m"
    if item.get_closest_marker("slow") is None or item.module.__name__ == "test_install":
        return None
    return "qwen2.5-coder-1.5b" if "qwen" in item.name else "smollm2-135m"


# the longest tests outside the real-target groups (each runs a subprocess: a pip resolution, the GPU check's dry run)
RUN_EARLY = ("test_install", "test_gpu_check")
START_ORDER = ("qwen2.5-coder-1.5b", "early", "smollm2-135m")  # then everything else, in collection order


def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n 2 --dist loadgroup`` (the README's test command) the tests of one real target
    run on one worker, which loads (and on a fresh machine converts) that target once; every other
    test goes to whichever worker is free. The longest tests start first, so that the two workers
    finish together rather than one waiting on a long test that started last."""
    rank = {}
    for item in items:
        target = real_target_of(item)
        if target is not None:
            item.add_marker(pytest.mark.xdist_group(target))
        kind = target or ("early" if item.module.__name__ in RUN_EARLY else None)
        rank[item.nodeid] = START_ORDER.index(kind) if kind in START_ORDER else len(START_ORDER)
    items.sort(key=lambda item: rank[item.nodeid])


@pytest.fixture(autouse=True)
def fixed_costs(request, monkeypatch):
    """The round policy's prices without the machine, for every test (chain and tree rounds): a fixed
    verification profile (1-32 tokens, 10-13 ms), no drafting cost, and no running updates from wall
    time. Its choices, and so every tau or drafter-run count a test asserts, then do not depend on
    how busy the machine is. A test of the timing code itself opts out with ``@pytest.mark.measured_costs``."""
    if request.node.get_closest_marker("measured_costs") is not None:
        return
    import hf_jetspec.policy as policy
    import hf_jetspec.generation.tree_decoding as td
    from hf_jetspec.policy import CostModel

    def profile(target, n):
        return [1, 2, 16, 32], [0.010, 0.011, 0.012, 0.013]

    monkeypatch.setattr(policy, "cost_profile_for", profile)
    monkeypatch.setattr(policy, "batch_cost_profile_for", lambda target, n, rows: profile(target, n))
    monkeypatch.setattr(td, "cost_profile_for", profile)
    from hf_jetspec.generation.static_rounds import StaticTarget

    monkeypatch.setattr(StaticTarget, "profile", lambda self, n: profile(None, n))  # compiled rounds price widths alike
    monkeypatch.setattr(CostModel, "observe_verify", lambda self, n, seconds: None)
    monkeypatch.setattr(CostModel, "observe_draft", lambda self, passes, seconds: None)


@pytest.fixture(scope="session")
def llama_target():
    return tiny_llama()


@pytest.fixture(scope="session")
def qwen_target():
    return tiny_qwen2()


@pytest.fixture(scope="session")
def trained_llama(llama_target):
    """(target, drafter that accepts often, prompts it was fitted on)."""
    drafter, prompts = train_drafter_on_greedy(llama_target)
    return llama_target, drafter, prompts


@pytest.fixture(scope="session")
def trained_qwen(qwen_target):
    drafter, prompts = train_drafter_on_greedy(qwen_target, seed=1)
    return qwen_target, drafter, prompts


@pytest.fixture(scope="session")
def smollm2():
    from hf_jetspec import load_target

    return load_target("smollm2-135m")
