"""JetSpecTrainer: trains a drafter against a frozen target, computing target states online."""

from __future__ import annotations

import torch
from transformers import Trainer

from ..modeling_drafter import JetSpecDrafter
from .blocks import build_block_inputs, clean_prefix_schedule, leading_matches, sample_anchor_positions, slot_weights
from .config import JetSpecTrainingArguments
from .labels import survival_gate
from .losses import divergence


class JetSpecTrainer(Trainer):
    """Trains a :class:`~hf_jetspec.JetSpecDrafter` (the ``model``) against a frozen ``target``.

    Every step runs the target over the batch once (read-layer states and logits, no gradient),
    samples ``blocks_per_sequence`` anchors per sequence in the response, builds the block inputs
    (clean prefix + context noise under Jacobi forcing), and minimises the slot-weighted
    divergence between the target's distributions and the drafter's at every block position.
    Logged besides the loss: ``acc_first`` (top-1 agreement at slot 1 on fully noised blocks) and
    ``tau_est`` (1 + mean leading top-1 agreement on fully noised blocks, an acceptance-length
    proxy under corpus conditioning).
    """

    def __init__(self, model: JetSpecDrafter, args: JetSpecTrainingArguments, target=None, **kwargs):
        if target is None:
            raise ValueError("JetSpecTrainer needs the frozen target model: JetSpecTrainer(model=drafter, target=target, ...)")
        super().__init__(model=model, args=args, **kwargs)
        target.eval()
        for p in target.parameters():
            p.requires_grad_(False)
        self.target = target
        model.attach_target(target)
        self.model_accepts_loss_kwargs = False
        self._noise = torch.Generator().manual_seed(args.noise_seed)
        self._metrics: dict[str, list[float]] = {}

    # ----------------------------------------------------------------------------------
    def _target_pass(self, input_ids, attention_mask, layer_ids):
        with torch.no_grad():
            out = self.target(
                input_ids=input_ids.to(self.target.device),
                attention_mask=attention_mask.to(self.target.device),
                output_hidden_states=[i + 1 for i in layer_ids],
            )
        states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
        return states, out.logits

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args: JetSpecTrainingArguments = self.args
        drafter = model.module if hasattr(model, "module") else model
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        starts, lengths = inputs["response_start"].cpu(), inputs["length"].cpu()
        gamma = args.block_size - 1
        nb = args.blocks_per_sequence
        states, target_logits = self._target_pass(ids, mask, drafter.config.target_layer_ids)

        bsz = ids.shape[0]
        cpu_ids = ids.cpu()
        anchors = sample_anchor_positions(starts, lengths, nb, gamma, self._noise)
        if args.block_inputs == "jacobi":
            offset = int(torch.randint(0, gamma, (1,), generator=self._noise))
            clean = clean_prefix_schedule(nb, gamma, offset)
        else:
            clean = torch.zeros(nb, dtype=torch.long)
        block_ids, noise_mask = build_block_inputs(cpu_ids, anchors, clean, gamma, self._noise)

        # labels: the target's distribution at positions a .. a+gamma-1 (predicting a+1 .. a+gamma)
        pos = (anchors[..., None] + torch.arange(gamma)).clamp(max=ids.shape[1] - 1)
        batch_idx = torch.arange(bsz)[:, None, None]
        label_logits = target_logits[batch_idx, pos.to(target_logits.device)]
        valid = ((anchors + gamma + 1) <= lengths[:, None]) & (anchors >= starts[:, None])  # [B, nb]
        weights = slot_weights(gamma, args.slot_decay)[None, None, :] * valid[..., None].float()
        if args.labels == "erase":
            weights = weights * self._survival_gate(target_logits, cpu_ids, anchors, gamma)
        elif args.labels != "corpus":
            raise NotImplementedError(f"labels={args.labels!r} is not implemented yet")

        out = model(
            context_states=states.to(drafter.device),
            block_input_ids=block_ids.to(drafter.device),
            anchor_positions=anchors.to(drafter.device),
            noise_mask=noise_mask.to(drafter.device),
        )
        draft_logits = out.logits
        if drafter.config.draft_vocab_size is not None:
            label_logits = label_logits.index_select(-1, drafter.draft_vocab.to(label_logits.device))
        per_slot = divergence(label_logits.to(draft_logits.device), draft_logits, args.divergence)
        w = weights.to(per_slot.device)
        loss = (per_slot * w).sum() / w.sum().clamp(min=1e-8)

        with torch.no_grad():
            noised = (clean == 0)[None, :].expand(bsz, nb) & valid
            if noised.any():
                agree = draft_logits.argmax(-1) == label_logits.argmax(-1).to(draft_logits.device)
                lead = leading_matches(agree.long(), torch.ones_like(agree.long()))
                self._record("acc_first", agree[..., 0][noised].float().mean().item())
                self._record("tau_est", 1.0 + lead[noised].float().mean().item())
        return (loss, out) if return_outputs else loss

    @staticmethod
    def _survival_gate(target_logits, ids, anchors, gamma):
        """Erase weights: the target's probability of each corpus token in the block, gated."""
        probs = torch.softmax(target_logits.float(), -1)
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)  # the token following each position
        p_next = probs.gather(-1, nxt.to(probs.device)[..., None]).squeeze(-1).cpu()
        pos = (anchors[..., None] + torch.arange(gamma)).clamp(max=ids.shape[1] - 1)
        return survival_gate(torch.gather(p_next[:, None, :].expand(-1, anchors.shape[1], -1), 2, pos))

    def _record(self, name: str, value: float) -> None:
        self._metrics.setdefault(name, []).append(value)

    def log(self, logs: dict, *args, **kwargs) -> None:
        for name, values in self._metrics.items():
            if values:
                logs[name] = sum(values) / len(values)
        self._metrics = {}
        super().log(logs, *args, **kwargs)
