"""Training of the foresight adapter (seed 000, Section 4.2 and Appendix A), TRL style."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from .losses import gap_recovered, state_prediction_loss
from .base import FrozenTargetTrainer
from .blocks import sample_anchor_positions


@dataclass
class ForesightTrainingArguments(TrainingArguments):
    """Arguments of :class:`ForesightAdapterTrainer` (block of the anchor + gamma = 15 draft positions)."""

    block_size: int = field(default=16, metadata={"help": "Positions predicted per block: the anchor and gamma draft tokens."})
    blocks_per_sequence: int = field(default=16, metadata={"help": "Blocks sampled per training sequence."})
    noise_seed: int = field(default=0, metadata={"help": "Seed of block placement."})
    remove_unused_columns: bool = field(default=False)

    def __post_init__(self):
        super().__post_init__()
        if self.block_size < 2:
            raise ValueError("block_size must be >= 2")


class ForesightAdapterTrainer(FrozenTargetTrainer):
    """Trains a :class:`~hf_jetspec.foresight.ForesightAdapter` (the ``model``) against a frozen ``target``.

    Every step runs the target once over the batch (read-layer states, no gradient), places
    ``blocks_per_sequence`` blocks per sequence in the response, and regresses the adapter's chained
    predictions of the block positions (each module reading the prediction below it, as at
    inference) onto the target's true states with Smooth L1 + cosine distance. Logged besides the
    loss: ``gap_recovered``, the share of the gap between copying the last verified state and the
    true states that the predictions close.
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args: ForesightTrainingArguments = self.args
        adapter = model.module if hasattr(model, "module") else model
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        starts, lengths = inputs["response_start"].cpu(), inputs["length"].cpu()
        layer_ids = adapter.config.target_layer_ids
        with torch.no_grad():
            out = self.target(input_ids=ids.to(self.target.device), attention_mask=mask.to(self.target.device),
                              output_hidden_states=[i + 1 for i in layer_ids], use_cache=False)
        states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
        length = args.block_size
        anchors = sample_anchor_positions(starts.clamp(min=1), lengths, args.blocks_per_sequence, length - 1, self._noise)
        valid = ((anchors + length) <= lengths[:, None]) & (anchors >= 1)
        pos = (anchors[..., None] + torch.arange(length)).clamp(max=ids.shape[1] - 1)
        bsz = ids.shape[0]
        blocks = torch.gather(ids.cpu()[:, None, :].expand(bsz, anchors.shape[1], -1), 2, pos)
        b = torch.arange(bsz)[:, None, None]
        true = states[b, pos.to(states.device)]
        pred = model(context_states=states, block_input_ids=blocks, anchor_positions=anchors)
        w = valid[..., None].expand(-1, -1, length).float().to(pred.device)
        loss = state_prediction_loss(pred, true.to(pred.device), w)
        with torch.no_grad():
            keep = valid.to(pred.device)
            if keep.any():
                copy = states[torch.arange(bsz)[:, None], (anchors - 1).clamp(min=0).to(states.device)][:, :, None, :].expand_as(true)
                self._record("gap_recovered", gap_recovered(pred[keep], true[keep.to(true.device)], copy[keep.to(copy.device)]))
        return (loss, pred) if return_outputs else loss
