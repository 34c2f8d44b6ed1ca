"""JetSpecTrainer: trains a drafter against a frozen target, with target features online or from an offline cache."""

from __future__ import annotations

import torch

from .base import FrozenTargetTrainer
from .blocks import clean_prefix_schedule, leading_matches, noisy_block_inputs, sample_anchor_positions, sample_draft_lengths, slot_weights
from .config import JetSpecTrainingArguments
from .labels import inherited_slots, ira_offsets, survival_gate
from .rollout import greedy_rollouts
from .feature_cache import next_token_logprobs
from .losses import MISSING_LOGIT, TopKLabels, divergence, label_argmax, label_known


class JetSpecTrainer(FrozenTargetTrainer):
    """Trains a :class:`~hf_jetspec.JetSpecDrafter` (the ``model``) against a frozen ``target``.

    Every step runs the target over the batch once (read-layer states and logits, no gradient)
    -- or, when the training set is a :class:`~hf_jetspec.training.FeatureCacheDataset`, reads them
    from the offline cache (corpus / erase labels; top-k target distributions) -- samples ``blocks_per_sequence`` anchors per sequence in the response, builds the block inputs
    (clean prefix + context noise under Jacobi forcing), and minimises the slot-weighted
    divergence between the target's distributions and the drafter's at every block position.
    Logged besides the loss, both on the training batches themselves (so they describe the answers
    trained on, not held-out text: a drafter's held-out tau is measured by
    :func:`~hf_jetspec.training.drafter_tau.acceptance_on_items`): ``train_acc_first`` (top-1
    agreement at slot 1 on fully noised blocks) and ``train_tau_est`` (1 + mean leading top-1
    agreement on fully noised blocks, an acceptance-length proxy under corpus conditioning).
    """

    def __init__(self, model, args, target=None, **kwargs):
        super().__init__(model=model, args=args, target=target, **kwargs)
        info = getattr(self.train_dataset, "info", None)
        if info is not None:  # an offline feature cache (FeatureCacheDataset)
            info.check_drafter(model)
            if args.labels in ("alr", "alr+ira"):
                raise ValueError(f"labels={args.labels!r} need the target's greedy rollouts, which a feature cache does not hold: train them online")
        drafter = model.module if hasattr(model, "module") else model
        if args.truncated_blocks > 0 and drafter.config.attention == "causal":
            raise ValueError("truncated_blocks trains a bidirectional drafter for shorter drafts; a causal drafter's rows never see "
                             "the rows after them, so its short drafts are its long drafts' first rows already")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args: JetSpecTrainingArguments = self.args
        drafter = model.module if hasattr(model, "module") else model
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        starts, lengths = inputs["response_start"].cpu(), inputs["length"].cpu()
        gamma = args.block_size - 1
        nb = args.blocks_per_sequence
        layer_ids = drafter.config.target_layer_ids
        use_rollouts = args.labels in ("alr", "alr+ira")
        if "cached_states" in inputs:  # features read from an offline cache: no target forward
            out = None
            states = inputs["cached_states"]
            labels_at = self._cached_labels(drafter, inputs["cached_topk_ids"].cpu(), inputs["cached_topk_logprobs"].cpu())
            next_logprob = inputs["cached_next_logprob"].cpu()
        else:
            with torch.no_grad():
                out = self.target(
                    input_ids=ids.to(self.target.device),
                    attention_mask=mask.to(self.target.device),
                    output_hidden_states=[i + 1 for i in layer_ids],
                    use_cache=use_rollouts,
                )
            states = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
            labels_at = self._online_labels(drafter, out.logits)
            next_logprob = None if args.labels != "erase" else next_token_logprobs(out.logits, ids).cpu()
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
            blocks = self._corpus_blocks(labels_at, next_logprob, states, cpu_ids, anchors, valid, gamma, w_slot, args.labels)
        block_ids, noise_mask = noisy_block_inputs(blocks["true"], cpu_ids, blocks["noise_limits"], clean, self._noise)
        lengths = None
        if args.truncated_blocks > 0:  # a share of blocks drafted shorter: their slots past k carry no loss
            lengths = sample_draft_lengths(ids.shape[0], block_ids.shape[1], gamma, args.truncated_blocks, self._noise)
            blocks["weights"] = blocks["weights"] * (torch.arange(gamma) < lengths[..., None]).to(blocks["weights"].device)

        fwd = model(
            context_states=blocks["context"].to(drafter.device),
            block_input_ids=block_ids.to(drafter.device),
            anchor_positions=blocks["anchors"].to(drafter.device),
            noise_mask=noise_mask.to(drafter.device),
            context_positions=None if blocks["context_positions"] is None else blocks["context_positions"].to(drafter.device),
            context_visible=None if blocks["context_visible"] is None else blocks["context_visible"].to(drafter.device),
            draft_lengths=None if lengths is None else lengths.to(drafter.device),
        )
        draft_logits = fwd.logits
        label_logits = blocks["labels"]
        if use_rollouts and drafter.config.draft_vocab_size is not None:
            label_logits = label_logits.index_select(-1, drafter.draft_vocab.to(label_logits.device))
        label_logits = label_logits.to(draft_logits.device)
        per_slot = divergence(label_logits, draft_logits, args.divergence)
        w = blocks["weights"].to(per_slot.device)
        loss = (per_slot * w).sum() / w.sum().clamp(min=1e-8)

        with torch.no_grad():
            noised = (clean[:n_primary] == 0)[None, :].expand(ids.shape[0], n_primary) & valid
            if lengths is not None:  # the metrics read whole blocks
                noised = noised & (lengths[:, :n_primary] == gamma)
            if noised.any():  # only the fully noised blocks' argmaxes are needed
                rows = noised.to(draft_logits.device)
                agree = (draft_logits[:, :n_primary][rows].argmax(-1) == label_argmax(label_logits[:, :n_primary][rows])).long()
                self._record("train_acc_first", agree[..., 0].float().mean().item())
                self._record("train_tau_est", 1.0 + leading_matches(agree, torch.ones_like(agree)).float().mean().item())
        return (loss, fwd) if return_outputs else loss

    @staticmethod
    def _online_labels(drafter, target_logits):
        """Label logits at positions ``pos`` [B, nb, gamma] from the target's logits (draft vocabulary if restricted)."""
        vocab = None if drafter.config.draft_vocab_size is None else drafter.draft_vocab.to(target_logits.device)

        def labels_at(pos):
            picked = target_logits[torch.arange(pos.shape[0])[:, None, None], pos.to(target_logits.device)]
            return picked if vocab is None else picked.index_select(-1, vocab)

        return labels_at

    @staticmethod
    def _cached_labels(drafter, topk_ids, topk_logprobs):
        """:class:`TopKLabels` at ``pos`` from cached top-k log-probabilities (tokens outside the draft vocabulary dropped)."""
        index = drafter.draft_index()

        def labels_at(pos):
            b = torch.arange(pos.shape[0])[:, None, None]
            ids, lp = topk_ids[b, pos].long(), topk_logprobs[b, pos].float()
            if index is not None:  # tokens outside the draft vocabulary are dropped (parked on row 0 as MISSING)
                ids = index[ids]
                lp = torch.where(ids >= 0, lp, torch.full_like(lp, MISSING_LOGIT))
                ids = ids.clamp(min=0)
            return TopKLabels(ids, lp)

        return labels_at

    def _corpus_blocks(self, labels_at, next_logprob, states, ids, anchors, valid, gamma, w_slot, labels):
        """corpus / erase: labels are the target's distributions after the corpus prefix."""
        bsz = ids.shape[0]
        pos = (anchors[..., None] + torch.arange(gamma)).clamp(max=ids.shape[1] - 1)
        label_logits = labels_at(pos)
        weights = w_slot[None, None, :] * valid[..., None].float()
        # a label with no token inside the draft vocabulary (every stored token outside it) says nothing
        # the drafter can learn: its softmax would be uniform, so it gets no weight
        weights = weights * label_known(label_logits).float().to(weights.device)
        if labels == "erase":
            p_next = next_logprob.exp()
            weights = weights * survival_gate(torch.gather(p_next[:, None, :].expand(-1, anchors.shape[1], -1), 2, pos))
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
