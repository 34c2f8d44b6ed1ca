"""Inference-time drafting options, kept on the drafter as ``drafter.drafting_config``."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

DRAFTING_CONFIG_NAME = "drafting_config.json"


@dataclass
class DraftingConfig:
    """How a :class:`~hf_jetspec.JetSpecDrafter` drafts inside ``generate``.

    Attributes:
        budget: block size at verification: the anchor plus ``budget - 1`` draft tokens per
            round (the seed's "budget 16" verifies 16 positions). Independent of the training
            block size.
        num_jacobi_passes: Jacobi refinement passes J after the initial draft J0 (Eq. 8). Each
            pass re-runs the drafter with its own previous draft as the block inputs. Passes stop
            early once the draft is a fixed point (a further pass could not change it).
        seed: seed of the drafter's private random generator (noise tokens of J0). It never
            touches the global RNG, so the target's sampling stream is unaffected.
    """

    budget: int = 16
    num_jacobi_passes: int = 1
    seed: int = 0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.budget, int) or self.budget < 2:
            raise ValueError(f"budget must be an int >= 2 (anchor + at least one draft token), got {self.budget!r}")
        if not isinstance(self.num_jacobi_passes, int) or self.num_jacobi_passes < 0:
            raise ValueError(f"num_jacobi_passes must be an int >= 0, got {self.num_jacobi_passes!r}")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def replace(self, **changes) -> "DraftingConfig":
        unknown = set(changes) - self.field_names()
        if unknown:
            raise TypeError(f"unknown drafting option(s) {sorted(unknown)}; known: {sorted(self.field_names())}")
        return dataclasses.replace(self, **changes)

    def save(self, directory: str | os.PathLike) -> None:
        with open(os.path.join(directory, DRAFTING_CONFIG_NAME), "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "DraftingConfig":
        path = os.path.join(directory, DRAFTING_CONFIG_NAME)
        if not os.path.isfile(path):
            return cls()
        with open(path) as f:
            data = json.load(f)
        known = cls.field_names()
        return cls(**{k: v for k, v in data.items() if k in known})
