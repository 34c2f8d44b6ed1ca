"""Serving engines: the export to vLLM's dflash folder (``interop.vllm``). The DFlash and
MuseGlimmerAssistant checkpoint conversions the drafter reads and writes live with the model
(:mod:`hf_jetspec.drafter.dflash_format`).

Import from the modules; this package file imports nothing."""
