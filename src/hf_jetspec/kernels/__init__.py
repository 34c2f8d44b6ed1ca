"""Tensor math under every other package: GPU kernels with their torch reference (chosen on CUDA where they
measure faster, never on CPU) and the float32 log-normaliser."""

from .log_normaliser import log_normaliser
from .head_argmax import HeadSummary, head_summary, head_summary_torch, select_head_kernel, summarise_logits, triton_available

__all__ = ["HeadSummary", "head_summary", "head_summary_torch", "log_normaliser", "select_head_kernel", "summarise_logits", "triton_available"]
