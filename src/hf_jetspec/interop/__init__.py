"""Interop with other formats and serving engines: DFlash / transformers' MuseGlimmerAssistant
conversions (``interop.dflash``) and the export to vLLM's dflash folder (``interop.vllm``).

Import from the modules; this package file imports nothing, so that a drafter loading a DFlash
checkpoint does not pull in the serving code."""
