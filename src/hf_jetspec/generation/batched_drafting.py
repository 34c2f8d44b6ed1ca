"""The block drafter as a proposal source of batched rounds: every live row drafted in one forward.

:func:`~hf_jetspec.generation.batched_decoding.batched_decoding` asks the target for the drafter's
read layers in each forward; the verified rows of each batch row (its prompt after the prefill, then
each round's anchor and accepted drafts) wait here until the drafter next runs, and are then
projected for all rows in one pass into :class:`~hf_jetspec.drafter.row_contexts.RowContexts`. A
drafting round builds one J0 block per live row (the row's anchor, then noise from its own tokens,
or mask inputs), drafts them all in one forward against their own contexts, and runs the Jacobi
passes the same way, stopping once every row has reached its fixed point. Each row's drafted block
is priced like a chain round's: the acceptance model's estimates from the top-1 probabilities and
the agreement with the previous pass, corrected by what verification has observed of drafted blocks.

Drafts are the drafter's argmax tokens in every mode; under sampling the batched loop verifies them
as point masses (accept ``d`` with ``p(d)``), which keeps each row's law the target's.
"""

from __future__ import annotations

import torch

from ..drafter.drafter_cache import gather_pending, trim_pending
from ..drafter.jacobi import sample_noise_tokens
from ..policy import acceptance_features, node_features
from .candidate_generator import CHAIN_SOURCE  # the calibration source of one-row chain rounds
from .tree import RankedTree, chain_tree, ranked_tree

NODE_SOURCE = "drafter"  # ... and as one-row tree rounds' drafter nodes (tree_decoding.TreeRoundPolicy)


def check_batched_drafter(assistant) -> None:
    """What only batched drafter rounds refuse (the seam refuses compiled rounds, an LM source and
    online learning for every batched call; ``new_row_contexts`` a sliding-window drafter)."""
    if assistant.drafter.drafting_config.needs_foresight_models:
        raise ValueError("foresight drafting and context refreshes draft one sequence at a time: set foresight=False and "
                         "num_context_refreshes=0 for batched generate")


class BatchedDrafter:
    """The drafter's side of a batched call: per-row contexts, pending verified states, calibration."""

    def __init__(self, assistant, rows: int):
        drafter = assistant.drafter
        self.drafter = drafter
        self.options = drafter.drafting_config
        self.window = self.options.effective_context_window
        self.hidden_layers = [i + 1 for i in drafter.config.target_layer_ids]
        self.contexts = drafter.new_row_contexts(rows, self.window)
        self.pending: list[list] = [[] for _ in range(rows)]
        # drafts are argmax tokens in every mode: the greedy fit prices them (the calibration corrects it)
        self.acceptance = assistant.acceptance_model_for(False)
        self.calibration = assistant.output_memory.node_calibration
        self.generator = torch.Generator(device=drafter.device).manual_seed(self.options.seed)
        self.raw: list[list[float]] = []

    def observe(self, j: int, states: list[torch.Tensor], positions: torch.Tensor) -> None:
        """Row ``j``'s newly verified positions: its read-layer states ``[1, T, H]`` at ``positions`` ``[T]``."""
        self.pending[j].append((states, positions))
        trim_pending(self.pending[j], self.window)

    def select(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` (in that order)."""
        self.contexts.select(keep)
        self.pending = [self.pending[j] for j in keep]

    def _flush(self) -> None:
        states, positions = [], []
        for j, waiting in enumerate(self.pending):
            if waiting:
                s, p = gather_pending(waiting, self.window)
                states.append(s)
                positions.append(p)
                waiting.clear()
            else:
                states.append(None)
                positions.append(None)
        self.drafter.append_row_contexts(self.contexts, states, positions)

    def _block_inputs(self, anchors: list[int], tokens: list[torch.Tensor], gamma: int):
        device = self.drafter.device
        rows = []
        for anchor, seen in zip(anchors, tokens):
            noise = sample_noise_tokens(seen.to(device), gamma - 1, self.generator)
            rows.append(torch.cat([torch.tensor([anchor], dtype=torch.long, device=device), noise.to(device, torch.long)]))
        inputs = torch.stack(rows)
        noise_mask = None
        if self.drafter.config.block_inputs == "mask":
            noise_mask = (torch.arange(gamma, device=device) > 0)[None].expand(len(anchors), -1)
        return inputs, noise_mask

    def _jacobi(self, anchors, starts, tokens, gamma: int, passes: int, run):
        """J0 and the Jacobi passes for every live row at once; ``run(inputs, start, noise_mask)`` is one
        drafter forward returning ``(argmax ids, extra)``. Returns the final ids, extra, agreement
        with the pass's inputs ``[B, gamma]`` and the passes run."""
        self._flush()
        inputs, noise_mask = self._block_inputs(anchors, tokens, gamma)
        start = torch.tensor(starts)
        draft, extra = run(inputs, start, noise_mask)
        ran = 1
        for _ in range(passes):
            new_inputs = torch.cat([inputs[:, :1], draft[:, :-1].to(inputs.device)], dim=1)
            if torch.equal(new_inputs, inputs):
                break  # every row at its fixed point
            inputs = new_inputs
            draft, extra = run(inputs, start, None)
            ran += 1
        agreed = torch.zeros(draft.shape, dtype=torch.bool)
        agreed[:, :-1] = (draft[:, :-1].to(inputs.device) == inputs[:, 1:]).cpu()
        return draft, extra, agreed, ran

    @torch.no_grad()
    def propose(self, anchors: list[int], starts: list[int], tokens: list[torch.Tensor], gamma: int) -> tuple[list[list[int]], list[list[float]], int]:
        """Draft ``gamma`` tokens after each live row's anchor (at sequence position ``starts[j]``, the row's
        verified tokens ``tokens[j]``) in one forward per pass. Returns the drafts, their calibrated
        conditional acceptance estimates, and the passes run."""
        draft, top1, agreed, passes = self._jacobi(anchors, starts, tokens, gamma, self.options.num_jacobi_passes,
                                                   lambda x, start, m: self.drafter.draft_rows(self.contexts, x, start, m))
        raw = self.acceptance.accept_probs(acceptance_features(top1.cpu(), agreed))
        self.raw = raw.tolist()
        probs = [self.calibration.chain(CHAIN_SOURCE, r) for r in self.raw]
        return draft.cpu().tolist(), probs, passes

    @torch.no_grad()
    def propose_trees(self, anchors: list[int], starts: list[int], tokens: list[torch.Tensor], gamma: int, depths: list[int],
                      chains: list[list]) -> tuple[list, int]:
        """A best-first tree per live row, as one-row tree rounds build it: the drafter's top-``tree_top_k``
        candidates of each position (all rows in one forward per pass) scored by the acceptance model,
        with the row's ``chains`` (``(tokens, conditional estimates)``, an n-gram continuation) grafted
        in, at most ``tree_node_budget`` nodes and ``depths[j]`` deep. Returns per row the
        :class:`~hf_jetspec.generation.tree.RankedTree` and the expected acceptance of each node's path
        (drafter nodes through the running calibration of their scores), and the passes run."""
        k = self.options.tree_top_k

        def run(x, start, noise_mask):
            ids, top_ids, top_probs = self.drafter.draft_rows_topk(self.contexts, x, start, k, noise_mask)
            return ids, (top_ids, top_probs)

        _, (top_ids, top_probs), agreed, passes = self._jacobi(anchors, starts, tokens, gamma, self.options.tree_passes, run)
        plans = []
        for j, depth in enumerate(depths):
            if depth <= 0:  # no room before the length limit: an empty tree (a plain step for the row)
                plans.append((RankedTree(chain_tree([]), [], [[] for _ in chains[j]], []), []))
                continue
            table = self.acceptance.accept_probs(node_features(top_probs[j, :depth].cpu(), agreed[j, :depth]))
            ranked = ranked_tree(top_ids[j, :depth].cpu(), table, self.options.tree_node_budget, None, chains[j])
            drafted = self.calibration(NODE_SOURCE, ranked.scores)
            plans.append((ranked, [s if grafted else d for s, d, grafted in zip(ranked.scores, drafted, ranked.from_chain)]))
        return plans, passes

    def verified_tree(self, ranked, nodes: int, accepted: list[int]) -> None:
        """A row's tree verified its first ``nodes`` nodes and accepted the path ``accepted``."""
        on_path = set(accepted)
        scored = [(s, i) for i, (s, grafted) in enumerate(zip(ranked.scores[:nodes], ranked.from_chain[:nodes])) if not grafted]
        if scored:
            self.calibration.observe(NODE_SOURCE, [s for s, _ in scored], [i in on_path for _, i in scored])

    def verified(self, j: int, drafted: int, accepted: int) -> None:
        """Row ``j`` verified ``drafted`` of its drafted tokens this round and accepted ``accepted``."""
        self.calibration.observe_chain(CHAIN_SOURCE, self.raw[j][:drafted], accepted)
