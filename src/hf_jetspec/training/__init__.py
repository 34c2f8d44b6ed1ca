"""Training of drafters: Jacobi forcing (seed 000) with corpus, erase, ALR and ALR+IRA labels (seed 003)."""

from .blocks import build_block_inputs, clean_prefix_schedule, sample_anchor_positions, slot_weights
from .config import JetSpecTrainingArguments
from .feature_cache import FeatureCacheCollator, FeatureCacheDataset, build_feature_cache
from .losses import divergence
from .trainer import JetSpecTrainer

__all__ = [
    "FeatureCacheCollator",
    "FeatureCacheDataset",
    "JetSpecTrainer",
    "JetSpecTrainingArguments",
    "build_block_inputs",
    "build_feature_cache",
    "clean_prefix_schedule",
    "divergence",
    "sample_anchor_positions",
    "slot_weights",
]
