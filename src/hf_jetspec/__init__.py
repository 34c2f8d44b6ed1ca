"""hf_jetspec: lossless speculative decoding for Hugging Face transformers."""

from transformers import AutoConfig, AutoModel

from . import seam
from .configuration_drafter import JetSpecDrafterConfig, default_target_layer_ids
from .drafting_config import DraftingConfig
from .modeling_drafter import JetSpecDrafter
from .stats import GenerationStats
from .targets import load_target

__version__ = "0.1.0"

AutoConfig.register(JetSpecDrafterConfig.model_type, JetSpecDrafterConfig, exist_ok=True)
AutoModel.register(JetSpecDrafterConfig, JetSpecDrafter, exist_ok=True)
seam.install()

__all__ = [
    "DraftingConfig",
    "GenerationStats",
    "JetSpecDrafter",
    "JetSpecDrafterConfig",
    "default_target_layer_ids",
    "load_target",
    "seam",
]
