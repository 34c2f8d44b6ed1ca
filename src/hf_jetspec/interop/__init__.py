"""Interop with serving engines: our drafters exported to the layouts they serve."""

from .vllm import VllmExport, VllmServer, export_for_vllm, vllm_command, vllm_servable_errors

__all__ = ["VllmExport", "VllmServer", "export_for_vllm", "vllm_command", "vllm_servable_errors"]
