"""Foresight drafting (seed 000, Sections 4.1-4.3): adapter, decoder, calibrated outcome selection,
speculation cache, context refresh with anchor replacement, and offline replay of selection rules."""

from transformers import AutoConfig, AutoModel

from .cache import CachedBlock, SpeculationCache
from .calibration import ForesightCalibration
from .configuration_adapter import ForesightAdapterConfig
from .decoder import ForesightDecoder
from .engine import ForesightEngine, ForesightRecord
from .layer_skip import LayerSkipAdapter, LayerSkipAdapterConfig
from .loading import LoadedForesight, load_foresight
from .modeling_adapter import ForesightAdapter

AutoConfig.register(ForesightAdapterConfig.model_type, ForesightAdapterConfig, exist_ok=True)
AutoModel.register(ForesightAdapterConfig, ForesightAdapter, exist_ok=True)

__all__ = [
    "CachedBlock",
    "ForesightAdapter",
    "ForesightAdapterConfig",
    "ForesightCalibration",
    "ForesightDecoder",
    "ForesightEngine",
    "ForesightRecord",
    "LayerSkipAdapter",
    "LayerSkipAdapterConfig",
    "LoadedForesight",
    "SpeculationCache",
    "load_foresight",
]
