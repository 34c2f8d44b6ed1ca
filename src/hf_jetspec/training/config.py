"""Training arguments of drafter training (TRL style: a ``TrainingArguments`` subclass)."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

LABELS = ("corpus", "erase", "alr", "alr+ira")
BLOCK_INPUTS = ("jacobi", "noised")


@dataclass
class JetSpecTrainingArguments(TrainingArguments):
    """Arguments of :class:`~hf_jetspec.training.JetSpecTrainer`.

    Defaults follow the papers (block 16 = anchor + 15 slots, forward KL, decay envelope with
    gamma = 7); the optimisation defaults are small-CPU friendly and meant to be overridden.
    """

    block_size: int = field(default=16, metadata={"help": "Training block size: the anchor plus block_size - 1 drafted slots."})
    blocks_per_sequence: int = field(default=16, metadata={"help": "Anchors sampled per training sequence."})
    labels: str = field(default="corpus", metadata={"help": f"Label construction, one of {LABELS}."})
    block_inputs: str = field(
        default="jacobi",
        metadata={"help": "'jacobi': clean prefix of every length 0..K-1 then noise (JetSpec++); 'noised': every block fully noised (DFlash/JetSpec)."},
    )
    divergence: str = field(default="forward_kl", metadata={"help": "forward_kl (default), reverse_kl or cross_entropy."})
    slot_decay: float | None = field(default=7.0, metadata={"help": "Decay envelope w_k = exp(-(k-1)/slot_decay); None for flat weights."})
    rollout_depth: int | None = field(default=None, metadata={"help": "ALR greedy rollout depth R (default K-1, supervising every slot)."})
    ira_fraction: float = field(default=0.5, metadata={"help": "Share of blocks relocated inside rollouts under alr+ira."})
    truncated_blocks: float = field(
        default=0.0,
        metadata={"help": "Share of blocks drafted at a shorter length k (uniform over 1..block_size - 2), seen as a server drafting "
                          "k tokens builds them (a bidirectional drafter's rows see only the rows that exist); slots past k get no loss."},
    )
    noise_seed: int = field(default=0, metadata={"help": "Seed of anchor / noise sampling."})
    remove_unused_columns: bool = field(default=False)

    def __post_init__(self):
        super().__post_init__()
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {self.labels!r}")
        if self.block_inputs not in BLOCK_INPUTS:
            raise ValueError(f"block_inputs must be one of {BLOCK_INPUTS}, got {self.block_inputs!r}")
        if self.block_size < 2:
            raise ValueError("block_size must be >= 2")
        if not 0.0 <= self.truncated_blocks <= 1.0:
            raise ValueError(f"truncated_blocks is a share of blocks, in [0, 1], got {self.truncated_blocks}")
