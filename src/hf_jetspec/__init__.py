"""hf_jetspec: lossless speculative decoding for Hugging Face transformers."""

from transformers import AutoConfig, AutoModel

from .assistant import DrafterFreeAssistant, DrafterFreeConfig, JetSpecAssistant
from .generation import seam
from .drafter.configuration_drafter import JetSpecDrafterConfig, default_target_layer_ids
from .drafter.drafting_config import DraftingConfig
from .drafter.modeling_drafter import JetSpecDrafter
from .generation.stats import GenerationStats
from .tools.targets import load_target
from .training.online import OnlineLearner, OnlineLearningConfig
from .training.replay_buffer import ReplayBuffer

__version__ = "0.1.0"

AutoConfig.register(JetSpecDrafterConfig.model_type, JetSpecDrafterConfig, exist_ok=True)
AutoModel.register(JetSpecDrafterConfig, JetSpecDrafter, exist_ok=True)
seam.install()

__all__ = [
    "DrafterFreeAssistant",
    "DrafterFreeConfig",
    "DraftingConfig",
    "GenerationStats",
    "JetSpecAssistant",
    "JetSpecDrafter",
    "JetSpecDrafterConfig",
    "OnlineLearner",
    "OnlineLearningConfig",
    "ReplayBuffer",
    "default_target_layer_ids",
    "load_target",
    "seam",
]
