"""Token trees for verification: several drafts checked in one target forward.

A :class:`DraftTree` holds the nodes that follow a round's anchor (the root, which is not a node):
their tokens, their parents (``-1``: a child of the root) and their depths (1 for the root's
children), in an order where every parent comes before its children, and with distinct tokens
among the children of any node. The target verifies ``[anchor] + nodes`` in one forward with
:func:`tree_attention_mask` and :func:`tree_positions`; :func:`accept_greedy` or
:func:`accept_sampled` then walk the tree from the root.

Trees are built from what one drafter pass gives, the per-position top-k of its block:
:func:`sibling_tree` (a static shape: the top-1 chain with alternative siblings at chosen depths)
and :func:`best_first_tree` (EAGLE-2-style: the ``budget`` nodes of highest cumulative draft
probability, treating positions as independent as Medusa does). :func:`ranked_tree` also grafts
whole proposals (the round policy's n-gram continuation) into the same budget and returns each
node's score, from which the policy picks how many nodes to verify.

Sampling with a tree is exact by the point-mass rule (seed, Appendix F.3) applied at each node:
draw the target's token ``v`` at the node; if ``v`` is one of the node's children, move there and
continue; otherwise commit ``v`` and stop. Every committed token is the target's own draw.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """Nodes after the root, parents before children. ``tokens``, ``parents``, ``depths``: [N] long (CPU)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor

    def __post_init__(self):
        n = self.tokens.numel()
        if self.parents.numel() != n or self.depths.numel() != n:
            raise ValueError("tokens, parents and depths must have one entry per node")
        for i in range(n):
            p = int(self.parents[i])
            if not -1 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come before their children")
            if int(self.depths[i]) != (1 if p < 0 else int(self.depths[p]) + 1):
                raise ValueError(f"node {i} has depth {int(self.depths[i])}, inconsistent with its parent")
        seen = set()
        for p, t in zip(self.parents.tolist(), self.tokens.tolist()):
            if (p, t) in seen:
                raise ValueError(f"token {t} appears twice among the children of node {p}")
            seen.add((p, t))

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def depth(self) -> int:
        return int(self.depths.max()) if len(self) else 0

    def children(self, node: int) -> dict[int, int]:
        """``{token: child index}`` of ``node`` (-1: the root)."""
        return {int(t): i for i, (p, t) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())) if p == node}

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (empty for the root, -1)."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]


def chain_tree(tokens) -> DraftTree:
    """A chain: each draft token the only child of the one before."""
    tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
    n = tokens.numel()
    return DraftTree(tokens, torch.arange(n) - 1, torch.arange(1, n + 1))


def sibling_tree(topk_ids: torch.Tensor, widths) -> DraftTree:
    """A static shape read off one block pass: the top-1 chain down to ``len(widths)`` levels, and at
    depth ``d`` ``widths[d-1] - 1`` more children of the chain node above (the next-ranked tokens of
    position ``d``), which are leaves. ``topk_ids`` is [D, K] (ranks sorted); nodes: ``sum(widths)``."""
    widths = [int(w) for w in widths]
    if len(widths) > topk_ids.shape[0] or any(w < 1 or w > topk_ids.shape[1] for w in widths):
        raise ValueError(f"widths {widths} need a top-k of at least {max(widths, default=1)} for {len(widths)} positions")
    tokens, parents, depths = [], [], []
    chain = -1
    for d, w in enumerate(widths):
        first = len(tokens)
        for r in range(w):
            tokens.append(int(topk_ids[d, r]))
            parents.append(chain)
            depths.append(d + 1)
        chain = first  # the rank-0 node carries the chain on
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), torch.tensor(depths, dtype=torch.long))


def best_first_tree(topk_ids: torch.Tensor, topk_probs: torch.Tensor, budget: int, branches=None) -> DraftTree:
    """The ``budget`` nodes of highest cumulative draft probability (EAGLE-2's selection rule).

    A node at depth ``d`` with ranks ``(r_1, ..., r_d)`` scores ``prod_j topk_probs[j-1, r_j]`` and
    holds ``topk_ids[d-1, r_d]``; a child never outscores its parent, so taking nodes best-first
    keeps the tree closed under parents. ``topk_ids`` / ``topk_probs`` are [D, K], ranks sorted.
    Ties break towards shallower, then lower-ranked nodes (deterministic).

    ``branches = (ids, probs)``, each [B, D - 1, K]: the top-k of depths 2..D re-drafted after the
    depth-1 alternatives of ranks 1..B (a drafter pass with that token in the block); nodes under
    those alternatives take their candidates and probabilities from there instead of ``topk_*``."""
    return ranked_tree(topk_ids, topk_probs, budget, branches).tree


@dataclass
class RankedTree:
    """A best-first tree with each node's score (the estimate that its whole path is accepted, non-
    increasing in node order, so every prefix ``tree[:n]`` is a tree too) and, per grafted chain, the
    nodes holding its first tokens (as many as made it into the tree, in chain order), and which
    source each node was taken for."""

    tree: DraftTree
    scores: list[float]
    chain_nodes: list[list[int]]
    from_chain: list[bool]  # per node: taken for a grafted chain (else for the drafter's candidates)


def ranked_tree(topk_ids: torch.Tensor, topk_probs: torch.Tensor, budget: int, branches=None, chains=()) -> RankedTree:
    """:func:`best_first_tree` that also returns the node scores and can graft whole chains in.

    ``chains``: ``(tokens, probs)`` pairs, each a proposal that starts after the root (an n-gram
    continuation) with the conditional acceptance estimate of each of its tokens; its ``i``-th token
    scores ``prod_{j<=i} probs[j]`` and competes for the budget with the drafter's nodes. Where a
    chain token and a drafter candidate are the same child of the same node they are one node (the
    first to be taken), and the subtrees of both sources grow under it."""
    depth, k = topk_ids.shape
    tables = [(topk_ids.tolist(), topk_probs.to(torch.float64).tolist())]
    if branches is not None:
        b_ids, b_probs = branches
        for b in range(b_ids.shape[0]):  # branch b + 1: depth 1 from the main pass, depths 2.. re-drafted
            tables.append(([tables[0][0][0]] + b_ids[b].tolist(), [tables[0][1][0]] + b_probs[b].to(torch.float64).tolist()))
    chains = [([int(t) for t in toks][:depth], [float(p) for p in probs]) for toks, probs in chains]
    # heap entries: (-score, depth, rank, push order, parent, source, index); source 0: table ``index``
    # (rank = the candidate's rank), source 1: chain ``index`` (rank k: after the drafter's ranks on ties)
    heap, pushed = [], 0

    def push(score, d, rank, parent, source, index):
        nonlocal pushed
        heapq.heappush(heap, (-score, d, rank, pushed, parent, source, index))
        pushed += 1

    probs0 = tables[0][1]
    for r in range(k):
        push(probs0[0][r], 1, r, -1, 0, r if r < len(tables) else 0)
    for c, (toks, probs) in enumerate(chains):
        if toks:
            push(probs[0], 1, k, -1, 1, c)
    tokens, parents, depths, scores, from_chain = [], [], [], [], []
    where: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    while heap and len(tokens) < budget:
        neg, d, r, _, parent, source, index = heapq.heappop(heap)
        token = tables[index][0][d - 1][r] if source == 0 else chains[index][0][d - 1]
        node = where.get((parent, token))
        if node is None:  # a new node; else the other source already took this child
            node = len(tokens)
            where[(parent, token)] = node
            tokens.append(token)
            parents.append(parent)
            depths.append(d)
            scores.append(-neg)
            from_chain.append(source == 1)
        if source == 0 and d < depth:
            probs = tables[index][1]
            for r2 in range(k):
                push(-neg * probs[d][r2], d + 1, r2, node, 0, index)
        elif source == 1:
            toks, probs = chains[index]
            if d < len(toks):
                push(-neg * probs[d], d + 1, k, node, 1, index)
    chain_nodes = []
    for toks, _ in chains:  # each chain's tokens as far as the tree holds them, whichever source took the node
        nodes, parent = [], -1
        for t in toks:
            parent = where.get((parent, t))
            if parent is None:
                break
            nodes.append(parent)
        chain_nodes.append(nodes)
    tree = DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), torch.tensor(depths, dtype=torch.long))
    return RankedTree(tree, scores, chain_nodes, from_chain)


def truncate_tree(tree: DraftTree, n: int) -> DraftTree:
    """The first ``n`` nodes (a tree whenever parents come before children, as they always do)."""
    return DraftTree(tree.tokens[:n], tree.parents[:n], tree.depths[:n])


def tree_attention_mask(tree: DraftTree) -> torch.Tensor:
    """[1 + N, 1 + N] boolean: row/column 0 is the root (anchor), node ``i`` is row ``1 + i``;
    each sees the root, its ancestors and itself (add the verified context, all visible, in front)."""
    n = len(tree)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i in range(n):
        mask[1 + i, 1 + i] = True
        p = int(tree.parents[i])
        if p >= 0:
            mask[1 + i] |= mask[1 + p]
    return mask


def tree_positions(tree: DraftTree, anchor_position: int) -> torch.Tensor:
    """Position ids [1 + N] of ``[anchor] + nodes``: a node sits at the anchor's position plus its depth."""
    return anchor_position + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths])


def accept_greedy(tree: DraftTree, target_tokens: torch.Tensor) -> tuple[list[int], int]:
    """Walk the tree on the target's choices. ``target_tokens`` [1 + N]: the target's token after the
    root and after each node (greedy: its argmax). Returns ``(accepted node indices, bonus token)``;
    the committed tokens are the accepted nodes' tokens, then the bonus."""
    return _walk(tree, lambda row: int(target_tokens[row]))


def accept_sampled(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """The point-mass rule per node: draw ``v ~ target_probs[row]`` at the root and at each accepted
    node, move to the child holding ``v`` or commit ``v`` and stop. ``target_probs`` [1 + N, V] are
    the target's (processed) distributions after the root and each node. Exact for any tree of
    deterministic drafts: each committed token is the target's own draw."""
    return _walk(tree, lambda row: int(torch.multinomial(target_probs[row].float(), 1, generator=generator)))


def _walk(tree: DraftTree, draw) -> tuple[list[int], int]:
    accepted, node = [], -1
    while True:
        v = draw(node + 1)
        child = tree.children(node).get(v)
        if child is None:
            return accepted, v
        accepted.append(child)
        node = child


# ---------------------------------------------------------------------------- sampled trees
@dataclass
class SampledTree:
    """A tree whose drafter nodes were drawn from the drafter's distributions, with each node's
    ordered draws for multi-draft verification.

    ``draws[node + 1]`` (``node = -1``: the root) lists the draws made at ``node``, in the order they
    are verified: ``(token, q_row, child)``, where ``q_row`` is the row of the proposal table the
    token was drawn from (``-1``: a point mass, an n-gram token) and ``child`` the node holding it
    (``-1``: a repeat of an earlier sibling draw, which has no node of its own)."""

    tree: DraftTree
    draws: list[list[tuple[int, int, int]]]
    origin: list[int]  # per node: the node of the shape it was drawn for


def sample_tree(shape: DraftTree, from_chain, q) -> SampledTree:
    """Draw the drafter's nodes of ``shape`` from the proposal ``q`` (a
    :class:`~hf_jetspec.generation.sampled_drafting.Proposal`, or probabilities [D, V]; depth ``d`` draws from
    row ``d - 1``, global random stream); nodes taken for a grafted chain (``from_chain[i]``) keep
    their token as a point mass.

    Each node of the shape is one draw at its parent, in node order: the shape only says how many
    draws each node gets and from which source, and it must be fixed before this call. A draw that
    repeats a sibling's token gets no node, and the shape's subtree under it is dropped: a repeat
    is verified only after the earlier draw of the same token was rejected, which leaves the
    residual no mass there, so it can never be accepted. A drafter draw whose row is not a
    distribution (the processors emptied it) is not made, and its subtree is dropped."""
    from .sampled_drafting import Proposal

    if not isinstance(q, Proposal):
        q = Proposal.from_probs(q)
    n = len(shape)
    valid = [i < q.usable_rows() for i in range(len(q))]
    keep: list[int] = [-1] * n  # shape node -> new node, -1: dropped
    tokens, parents, depths = [], [], []
    draws: list[list[tuple[int, int, int]]] = [[]]
    where: dict[tuple[int, int], int] = {}
    drawn = shape.tokens.tolist()
    sampled = [i for i in range(n) if not from_chain[i] and valid[int(shape.depths[i]) - 1]]
    if sampled:  # one draw per drafter node, all rows at once
        rows = torch.tensor([int(shape.depths[i]) - 1 for i in sampled])
        for i, t in zip(sampled, q.sample(rows).tolist()):
            drawn[i] = t
    for i in range(n):
        p = int(shape.parents[i])
        parent = -1 if p < 0 else keep[p]
        if p >= 0 and parent < 0:
            continue  # under a dropped node
        row = -1 if from_chain[i] else int(shape.depths[i]) - 1
        if row >= 0 and not valid[row]:
            continue
        token = int(drawn[i])
        child = where.get((parent, token), -1)
        if child >= 0:  # a repeat: a draw to verify, no node
            draws[parent + 1].append((token, row, -1))
            continue
        child = len(tokens)
        where[(parent, token)] = child
        keep[i] = child
        tokens.append(token)
        parents.append(parent)
        depths.append(1 if parent < 0 else depths[parent] + 1)
        draws.append([])
        draws[parent + 1].append((token, row, child))
    tree = DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     torch.tensor(depths, dtype=torch.long))
    origin = [0] * len(tokens)
    for i, node in enumerate(keep):
        if node >= 0:
            origin[node] = i
    return SampledTree(tree, draws, origin)


def accept_multidraft(sampled: SampledTree, target_probs: torch.Tensor, q_probs: torch.Tensor) -> tuple[list[int], int]:
    """Multi-draft speculative sampling (SpecInfer's rule, one draw at a time) down a sampled tree.

    At the root and at each accepted node, with ``p`` the target's (processed) distribution there,
    the node's draws are verified in order: a draw ``x`` from ``q`` is accepted with probability
    ``min(1, p(x) / q(x))``, a point mass ``x`` with probability ``p(x)``; on a rejection ``p``
    becomes the residual ``norm(max(p - q, 0))`` (a point mass: ``p`` without ``x``) and the next
    draw is verified against it. An accepted draw moves to its node; when every draw is rejected the
    residual's own draw is committed and the round ends. Each step is an ordinary speculative
    sampling step aimed at the current ``p`` with an independent draw, which returns ``p``'s law
    exactly, so every committed token follows the target's. Returns ``(accepted nodes, bonus)``."""
    accepted, node = [], -1
    while True:
        p = target_probs[node + 1].float().clone()
        moved = False
        for token, row, child in sampled.draws[node + 1]:
            u = float(torch.rand(()))
            if row < 0:
                ok = u < float(p[token])
            else:
                q = q_probs[row].float()
                ok = u * float(q[token]) <= float(p[token]) and float(q[token]) > 0
            if ok:
                if child < 0:  # a repeat accepted (only by rounding): commit it and end the round
                    return accepted, token
                accepted.append(child)
                node, moved = child, True
                break
            p = _residual(p, token, None if row < 0 else q_probs[row].float())
        if not moved:
            return accepted, int(torch.multinomial(p, 1))


def _residual(p: torch.Tensor, token: int, q: torch.Tensor | None) -> torch.Tensor:
    """``norm(max(p - q, 0))`` after a rejected draw (``q`` None: the point mass at ``token``)."""
    if q is None:
        r = p.clone()
        r[token] = 0.0
    else:
        r = torch.clamp(p - q, min=0.0)
    total = float(r.sum())
    return r / total if total > 0 else p
