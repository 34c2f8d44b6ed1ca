"""Tiny targets and a quickly trained drafter for mechanics tests (see :mod:`hf_jetspec.testing`)."""

from hf_jetspec.testing import tiny_llama, tiny_qwen2, train_drafter_on_greedy

__all__ = ["tiny_llama", "tiny_qwen2", "train_drafter_on_greedy"]
