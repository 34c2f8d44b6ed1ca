import os

# Tests never reach the Hugging Face Hub: every model they load is local or embedded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import tiny_llama, tiny_qwen2, train_drafter_on_greedy  # noqa: E402

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


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
