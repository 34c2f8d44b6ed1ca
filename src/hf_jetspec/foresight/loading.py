"""One loader for a foresight folder: either kind of adapter, and its calibration if saved beside it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .calibration import CALIBRATION_NAME, ForesightCalibration
from .layer_skip import LayerSkipAdapter
from .modeling_adapter import ForesightAdapter


@dataclass
class LoadedForesight:
    """An adapter (trained :class:`ForesightAdapter` or training-free :class:`LayerSkipAdapter`) and
    the fitted selection rule found beside it (None if the folder has none)."""

    adapter: ForesightAdapter | LayerSkipAdapter
    calibration: ForesightCalibration | None = None


def load_foresight(folder: str | os.PathLike, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> LoadedForesight:
    """Load the adapter saved in ``folder`` (a layer-skip config or trained weights) and its
    ``foresight_calibration.json`` if present. A trained adapter is cast to ``dtype`` / moved to
    ``device`` when given; a layer-skip adapter holds no weights of its own."""
    folder = str(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no foresight adapter folder at {folder!r}")
    if LayerSkipAdapter.is_folder(folder):
        adapter = LayerSkipAdapter.from_pretrained(folder)
    else:
        adapter = ForesightAdapter.from_pretrained(folder, **({"dtype": dtype} if dtype is not None else {}))
        if device is not None:
            adapter = adapter.to(device)
    calibration = ForesightCalibration.load(folder) if os.path.isfile(os.path.join(folder, CALIBRATION_NAME)) else None
    return LoadedForesight(adapter, calibration)
