"""A training-free foresight adapter: a subset of the target's own layers with exact context.

The trained :class:`~hf_jetspec.foresight.ForesightAdapter` is cheap but approximate. This adapter
is the other end of the trade-off: the block runs through the target's own layers ``keep_layers``
(by reference, nothing is copied or saved), each attending to keys/values of the verified context
computed from the target's true inputs of that layer, so the only approximation is the skipped
layers. With every layer up to the deepest read layer kept it predicts the true states exactly.
How many layers it takes to foresee the target's next token is measured by
``benchmarks/foresight_depth.py``.

The prediction for a read layer ``r`` is the running state after the last kept layer ``<= r``
(the token embeddings when there is none), in the drafter's context layout.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch

from ..drafter.drafter_cache import DrafterCache
from .target_layers import TargetLayerChain

CONFIG_NAME = "layer_skip_adapter.json"


@dataclass
class LayerSkipAdapterConfig:
    """Which target layers the adapter runs, and which read layers it predicts."""

    target_layer_ids: list[int]
    keep_layers: list[int]
    target_model_type: str | None = None
    target_num_hidden_layers: int | None = None
    target_hidden_size: int | None = None

    def __post_init__(self):
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        self.keep_layers = [int(i) for i in self.keep_layers]
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one read layer")
        if self.keep_layers != sorted(set(self.keep_layers)):
            raise ValueError(f"keep_layers must be sorted and without repeats, got {self.keep_layers}")
        if self.keep_layers and (self.keep_layers[0] < 0 or self.keep_layers[-1] > max(self.target_layer_ids)):
            raise ValueError(
                f"keep_layers must lie in 0..{max(self.target_layer_ids)} (the deepest read layer; the layers above it "
                f"are the foresight decoder's), got {self.keep_layers}"
            )

    @property
    def hidden_size(self) -> int:
        return self.target_hidden_size


def parse_layer_ranges(text: str) -> list[int]:
    """``"0-9,20-27"`` -> ``[0, 1, .., 9, 20, .., 27]`` (sorted, no repeats)."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        lo_i, hi_i = int(lo), int(hi or lo)
        if hi_i < lo_i:
            raise ValueError(f"bad layer range {part!r} in {text!r}")
        out.update(range(lo_i, hi_i + 1))
    return sorted(out)


def read_layer_sources(target_layer_ids: list[int], keep_layers: list[int]) -> list[int]:
    """For each read layer, how many kept layers have run when its prediction is taken."""
    return [sum(1 for k in keep_layers if k <= r) for r in target_layer_ids]


class LayerSkipAdapter:
    """Foresight adapter made of the target's own layers ``config.keep_layers`` (training-free).

    Same serving interface as :class:`~hf_jetspec.foresight.ForesightAdapter`; in addition
    :attr:`state_indices` names the ``output_hidden_states`` it needs (the true inputs of the kept
    layers), passed to :meth:`append_context` as ``layer_inputs``.
    """

    def __init__(self, config: LayerSkipAdapterConfig):
        self.config = config
        self._target = None
        self._chain: TargetLayerChain | None = None

    # ------------------------------------------------------------------ construction / files
    @classmethod
    def for_drafter(cls, drafter, keep_layers: list[int] | str) -> "LayerSkipAdapter":
        keep = parse_layer_ranges(keep_layers) if isinstance(keep_layers, str) else list(keep_layers)
        cfg = drafter.config
        adapter = cls(LayerSkipAdapterConfig(list(cfg.target_layer_ids), keep, cfg.target_model_type, cfg.target_num_hidden_layers,
                                             cfg.target_hidden_size))
        if drafter.__dict__.get("_target") is not None:
            adapter.attach_target(drafter.target)
        return adapter

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, CONFIG_NAME), "w") as f:
            json.dump(asdict(self.config), f, indent=2)
            f.write("\n")

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "LayerSkipAdapter":
        path = os.path.join(folder, CONFIG_NAME)
        try:
            with open(path) as f:
                values = json.load(f)
            return cls(LayerSkipAdapterConfig(**values))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path} is not a valid layer-skip adapter config ({e}); recreate it with LayerSkipAdapter.save_pretrained") from e

    @staticmethod
    def is_folder(folder: str | os.PathLike) -> bool:
        return os.path.isfile(os.path.join(folder, CONFIG_NAME))

    # ------------------------------------------------------------------ target / drafter checks
    def attach_target(self, target) -> None:
        cfg = target.config.get_text_config()
        c = self.config
        mine = (c.target_model_type, c.target_num_hidden_layers, c.target_hidden_size)
        theirs = (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size)
        if any(m is not None for m in mine) and mine != theirs:
            raise ValueError(f"this layer-skip adapter was made for a target {mine} (type, layers, hidden), not {theirs}")
        self._chain = TargetLayerChain(target, c.keep_layers, "layer-skip adapter")
        self._target = target
        self._embed = target.get_input_embeddings()
        if c.target_hidden_size is None:
            c.target_hidden_size = cfg.hidden_size

    @property
    def target(self):
        if self._target is None:
            raise RuntimeError("this adapter has no target attached: call adapter.attach_target(target)")
        return self._target

    def check_drafter(self, drafter) -> None:
        if list(drafter.config.target_layer_ids) != list(self.config.target_layer_ids):
            raise ValueError(
                f"the layer-skip adapter predicts target layers {self.config.target_layer_ids} but the drafter reads "
                f"{drafter.config.target_layer_ids}; build it with LayerSkipAdapter.for_drafter(drafter, ...)"
            )

    def eval(self) -> "LayerSkipAdapter":
        return self

    @property
    def device(self) -> torch.device:
        return self._embed.weight.device if self._target is not None else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return self._embed.weight.dtype if self._target is not None else torch.float32

    @property
    def state_indices(self) -> list[int]:
        """``output_hidden_states`` indices of the kept layers' true inputs (index i = input of layer i)."""
        return list(self.config.keep_layers)

    # ------------------------------------------------------------------ serving
    @property
    def chain(self) -> TargetLayerChain:
        if self._chain is None:
            raise RuntimeError("this adapter has no target attached: call adapter.attach_target(target)")
        return self._chain

    def new_cache(self) -> DrafterCache:
        return DrafterCache(len(self.config.keep_layers))

    @torch.no_grad()
    def append_context(self, cache: DrafterCache, target_states: torch.Tensor, positions: torch.Tensor, layer_inputs=None) -> None:
        """Add verified positions; ``layer_inputs`` [1, T, H] per kept layer (``hidden_states[i]`` for :attr:`state_indices`)."""
        self.chain.append_context(cache, [] if layer_inputs is None else layer_inputs, positions)

    @torch.no_grad()
    def extra_context(self, predicted_states: torch.Tensor, positions: torch.Tensor, layer_inputs=None):
        """Keys/values of predicted rows (``layer_inputs`` as returned by :meth:`predict`)."""
        return self.chain.kv([] if layer_inputs is None else layer_inputs, positions)

    @torch.no_grad()
    def predict(self, cache: DrafterCache, block_ids: torch.Tensor, start_positions: torch.Tensor, extra=None, return_layer_inputs: bool = False):
        """Predicted read-layer states [B, L, n*H] of blocks ``block_ids`` [B, L] (and each kept layer's inputs)."""
        x = self._embed(block_ids.to(self.device))
        out, inputs = self.chain.run(cache, x, start_positions, extra)
        snapshots = inputs + [out]  # snapshots[n]: the running state after n kept layers
        pred = torch.cat([snapshots[n] for n in read_layer_sources(self.config.target_layer_ids, self.config.keep_layers)], dim=-1)
        return (pred, inputs) if return_layer_inputs else pred
