"""A drafter composed with what serves it beside its weights (the floor above the model, the policy
and foresight, below the generation loop)."""

from .assistant import JetSpecAssistant, assistant_for
from .drafter_free import DrafterFreeAssistant, DrafterFreeConfig
from .lm_source import LMChain, LMSource, LMSourceConfig

__all__ = ["DrafterFreeAssistant", "DrafterFreeConfig", "JetSpecAssistant", "LMChain", "LMSource", "LMSourceConfig", "assistant_for"]
