"""SpecCTMC: exact speculative sampling for the continuous-time Markov chain of a masked denoiser."""

from .denoisers import Denoiser, MaskedLMDenoiser, antiberty_denoiser, load_antiberty, truncated_masked_lm
from .exact import exact_final_law
from .marks import accepted_mass, acceptance_probability, mark_law, next_tick, rejection_probability, residual_law
from .sampler import CTMCStats, sample, speculative_sample

__all__ = [
    "CTMCStats",
    "Denoiser",
    "MaskedLMDenoiser",
    "accepted_mass",
    "acceptance_probability",
    "antiberty_denoiser",
    "exact_final_law",
    "load_antiberty",
    "mark_law",
    "next_tick",
    "rejection_probability",
    "residual_law",
    "sample",
    "speculative_sample",
    "truncated_masked_lm",
]
