"""JetSpecTrainer: trains a drafter against a frozen target, computing target states online."""

from __future__ import annotations

import torch

from .base import FrozenTargetTrainer
from .blocks import clean_prefix_schedule, leading_matches, noisy_block_inputs, sample_anchor_positions, slot_weights
from .config import JetSpecTrainingArguments
from .labels import inherited_slots, ira_offsets, survival_gate
from .rollout import greedy_rollouts
from .losses import divergence


class JetSpecTrainer(FrozenTargetTrainer):
    """Trains a :class:`~hf_jetspec.JetSpecDrafter` (the ``model``) against a frozen ``target``.

    Every step runs the target over the batch once (read-layer states and logits, no gradient),
    samples ``blocks_per_sequence`` anchors per sequence in the response, builds the block inputs
    (clean prefix + context noise under Jacobi forcing), and minimises the slot-weighted
    divergence between the target's distributions and the drafter's at every block position.
    Logged besides the loss: ``acc_first`` (top-1 agreement at slot 1 on fully noised blocks) and
    ``tau_est`` (1 + mean leading top-1 agreement on fully noised blocks, an acceptance-length
    proxy under corpus conditioning).
    """

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args: JetSpecTrainingArguments = self.args
        drafter = model.module if hasattr(model, "module") else model
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        starts, lengths = inputs["response_start"].cpu(), inputs["length"].cpu()
        gamma = args.block_size - 1
        nb = args.blocks_per_sequence
        layer_ids = drafter.config.target_layer_ids
        use_rollouts = args.labels in ("alr", "alr+ira")
        with torch.no_grad():
            out = self.target(
                input_ids=ids.to(self.target.device),
                attention_mask=mask.to(self.target.device),
                output_hidden_states=[i + 1 for i in layer_ids],
                use_cache=use_rollouts,
            )
        states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
        cpu_ids = ids.cpu()
        n_secondary = int(round(nb * args.ira_fraction)) if args.labels == "alr+ira" else 0
        n_primary = nb - n_secondary
        anchors = sample_anchor_positions(starts, lengths, n_primary, gamma, self._noise)
        valid = ((anchors + gamma + 1) <= lengths[:, None]) & (anchors >= starts[:, None])
        if args.block_inputs == "jacobi":
            clean = clean_prefix_schedule(nb, gamma, int(torch.randint(0, gamma, (1,), generator=self._noise)))
        else:
            clean = torch.zeros(nb, dtype=torch.long)
        w_slot = slot_weights(gamma, args.slot_decay)

        if use_rollouts:
            blocks = self._rollout_blocks(out, states, cpu_ids, anchors, valid, gamma, n_secondary, w_slot, layer_ids)
        else:
            blocks = self._corpus_blocks(out.logits, states, cpu_ids, anchors, valid, gamma, w_slot, args.labels)
        block_ids, noise_mask = noisy_block_inputs(blocks["true"], cpu_ids, blocks["noise_limits"], clean, self._noise)

        fwd = model(
            context_states=blocks["context"].to(drafter.device),
            block_input_ids=block_ids.to(drafter.device),
            anchor_positions=blocks["anchors"].to(drafter.device),
            noise_mask=noise_mask.to(drafter.device),
            context_positions=None if blocks["context_positions"] is None else blocks["context_positions"].to(drafter.device),
            context_visible=None if blocks["context_visible"] is None else blocks["context_visible"].to(drafter.device),
        )
        draft_logits = fwd.logits
        label_logits = blocks["labels"]
        if drafter.config.draft_vocab_size is not None:
            label_logits = label_logits.index_select(-1, drafter.draft_vocab.to(label_logits.device))
        per_slot = divergence(label_logits.to(draft_logits.device), draft_logits, args.divergence)
        w = blocks["weights"].to(per_slot.device)
        loss = (per_slot * w).sum() / w.sum().clamp(min=1e-8)

        with torch.no_grad():
            noised = (clean[:n_primary] == 0)[None, :].expand(ids.shape[0], n_primary) & valid
            if noised.any():
                agree = (draft_logits[:, :n_primary].argmax(-1) == label_logits[:, :n_primary].argmax(-1).to(draft_logits.device)).long()
                self._record("acc_first", agree[..., 0][noised].float().mean().item())
                self._record("tau_est", 1.0 + leading_matches(agree, torch.ones_like(agree))[noised].float().mean().item())
        return (loss, fwd) if return_outputs else loss

    def _corpus_blocks(self, target_logits, states, ids, anchors, valid, gamma, w_slot, labels):
        """corpus / erase: labels are the target's distributions after the corpus prefix."""
        bsz = ids.shape[0]
        pos = (anchors[..., None] + torch.arange(gamma)).clamp(max=ids.shape[1] - 1)
        label_logits = target_logits[torch.arange(bsz)[:, None, None], pos.to(target_logits.device)]
        weights = w_slot[None, None, :] * valid[..., None].float()
        if labels == "erase":
            weights = weights * self._survival_gate(target_logits, ids, anchors, gamma)
        true = torch.gather(ids[:, None, :].expand(bsz, anchors.shape[1], -1), 2, pos)
        return {"true": true, "labels": label_logits, "weights": weights, "anchors": anchors, "noise_limits": anchors,
                "context": states, "context_positions": None, "context_visible": None}

    def _rollout_blocks(self, out, states, ids, anchors, valid, gamma, n_secondary, w_slot, layer_ids):
        """alr / alr+ira: labels from greedy target rollouts; IRA blocks anchored inside them."""
        args = self.args
        K = gamma
        depth = args.rollout_depth if args.rollout_depth is not None else K - 1
        if depth < K - 1:
            raise ValueError(f"rollout_depth must be >= block_size - 2 = {K - 1} to label every slot")
        eos = self.target.generation_config.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        ro = greedy_rollouts(self.target, out, anchors, depth, layer_ids, eos)
        bsz, n_primary = anchors.shape
        device = ro.logits.device
        anchor_tok = torch.gather(ids, 1, anchors)  # x_a
        seq = torch.cat([anchor_tok[..., None].to(device), ro.tokens], dim=-1)  # index 0 = x_a, r = y*_r
        true_p = seq[..., :K]
        labels_p = ro.logits[:, :, :K]
        weights_p = w_slot[None, None].to(device) * ro.alive[..., :K].float() * valid[..., None].float().to(device)
        t = states.shape[1]
        ctx_states = torch.cat([states, ro.states.reshape(bsz, n_primary * depth, -1)], dim=1)
        roll_pos = (anchors[..., None] + torch.arange(1, depth + 1)).reshape(bsz, n_primary * depth)
        ctx_pos = torch.cat([torch.arange(t)[None].expand(bsz, t), roll_pos], dim=1)
        vis_p = torch.cat([
            torch.arange(t)[None, None, :] < anchors[..., None],
            torch.zeros(bsz, n_primary, n_primary * depth, dtype=torch.bool),
        ], dim=-1)
        true, labels, weights, all_anchors, limits, vis = [true_p], [labels_p], [weights_p], [anchors], [anchors], [vis_p]
        if n_secondary:
            parent = torch.arange(n_secondary) % n_primary
            j = ira_offsets(bsz * n_secondary, K, self._noise).view(bsz, n_secondary)
            b = torch.arange(bsz)[:, None]
            src = (j[..., None] + torch.arange(K)).clamp(max=seq.shape[-1] - 1)
            true.append(torch.gather(seq[b, parent], 2, src.to(device)))
            lab_idx, lab_valid = inherited_slots(j, K)
            plog = ro.logits[b, parent]  # [B, ns, R+1, V]
            labels.append(torch.gather(plog, 2, lab_idx.to(device)[..., None].expand(-1, -1, -1, plog.shape[-1])))
            alive = torch.gather(ro.alive[b, parent], 2, lab_idx.to(device))
            weights.append(w_slot[None, None].to(device) * lab_valid.to(device).float() * alive.float() * valid[b, parent][..., None].float().to(device))
            a_parent = anchors[b, parent]
            all_anchors.append(a_parent + j)
            limits.append(a_parent + 1)
            own = torch.zeros(bsz, n_secondary, n_primary, depth, dtype=torch.bool)
            r = torch.arange(1, depth + 1)
            own[b, torch.arange(n_secondary)[None], parent[None].expand(bsz, -1)] = r[None, None, :] <= (j - 1)[..., None]
            vis.append(torch.cat([
                torch.arange(t)[None, None, :] <= a_parent[..., None],
                own.reshape(bsz, n_secondary, n_primary * depth),
            ], dim=-1))
        return {"true": torch.cat(true, 1).cpu(), "labels": torch.cat(labels, 1), "weights": torch.cat(weights, 1),
                "anchors": torch.cat(all_anchors, 1), "noise_limits": torch.cat(limits, 1),
                "context": ctx_states, "context_positions": ctx_pos, "context_visible": torch.cat(vis, 1)}

    @staticmethod
    def _survival_gate(target_logits, ids, anchors, gamma):
        """Erase weights: the target's probability of each corpus token in the block, gated."""
        probs = torch.softmax(target_logits.float(), -1)
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)  # the token following each position
        p_next = probs.gather(-1, nxt.to(probs.device)[..., None]).squeeze(-1).cpu()
        pos = (anchors[..., None] + torch.arange(gamma)).clamp(max=ids.shape[1] - 1)
        return survival_gate(torch.gather(p_next[:, None, :].expand(-1, anchors.shape[1], -1), 2, pos))
