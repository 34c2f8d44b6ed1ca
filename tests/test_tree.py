"""Token trees: construction, masks and positions on hand-checked cases; the tree walk's exactness
against an enumerated law, and a wrong walk that the same test rejects."""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from hf_jetspec.generation.tree import (
    DraftTree,
    accept_greedy,
    accept_multidraft,
    accept_sampled,
    best_first_tree,
    chain_tree,
    ranked_tree,
    sample_tree,
    sibling_tree,
    tree_attention_mask,
    tree_positions,
    truncate_tree,
)

TOPK_IDS = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])


def test_chain_is_a_tree_with_one_child_per_node():
    tree = chain_tree([5, 6, 7])
    assert tree.parents.tolist() == [-1, 0, 1] and tree.depths.tolist() == [1, 2, 3]
    assert torch.equal(tree_attention_mask(tree), torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    assert tree_positions(tree, 9).tolist() == [9, 10, 11, 12]


def test_sibling_tree_by_hand():
    tree = sibling_tree(TOPK_IDS, (3, 2, 1))
    assert tree.tokens.tolist() == [10, 11, 12, 20, 21, 30]
    assert tree.parents.tolist() == [-1, -1, -1, 0, 0, 3]
    assert tree.depths.tolist() == [1, 1, 1, 2, 2, 3]
    mask = tree_attention_mask(tree).int()
    # rows: root, 10, 11, 12, 20 (under 10), 21 (under 10), 30 (under 20)
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 0],
        [1, 1, 0, 0, 1, 0, 1],
    ]
    assert tree_positions(tree, 100).tolist() == [100, 101, 101, 101, 102, 102, 103]
    assert tree.children(-1) == {10: 0, 11: 1, 12: 2} and tree.path(5) == [0, 3, 5]
    with pytest.raises(ValueError, match="top-k"):
        sibling_tree(TOPK_IDS, (4,))


def test_best_first_tree_by_hand():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]])
    # scores: 10: .6; 11: .3; 10>20: .30; 10>21: .24; 10>20>30: .27; 11>20: .15 ...
    # best first: 10 (.6), 11 (.3, shallower than 10>20's .3), 10>20 (.3), 10>20>30 (.27), 10>21 (.24)
    tree = best_first_tree(TOPK_IDS, probs, budget=5)
    assert tree.tokens.tolist() == [10, 11, 20, 30, 21]
    assert tree.parents.tolist() == [-1, -1, 0, 2, 0]
    assert tree.depths.tolist() == [1, 1, 2, 3, 2]
    assert len(best_first_tree(TOPK_IDS, probs, budget=100)) == 3 + 9 + 27  # every node of the full tree
    chain = best_first_tree(TOPK_IDS, torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0]]), budget=3)
    assert chain.tokens.tolist() == [10, 20, 30] and chain.parents.tolist() == [-1, 0, 1]


def test_best_first_tree_with_redrafted_branches_by_hand():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]])
    # under the rank-1 alternative (11) the re-drafted depth 2 is confident: 11>40 scores .3 * .9 = .27
    b_ids = torch.tensor([[[40, 41, 42], [50, 51, 52]]])
    b_probs = torch.tensor([[[0.9, 0.05, 0.05], [0.8, 0.1, 0.1]]])
    tree = best_first_tree(TOPK_IDS, probs, budget=5, branches=(b_ids, b_probs))
    # 10 (.6), 11 (.3), 10>20 (.3), then 11>40 and 10>20>30 tie at .27: the shallower first
    assert tree.tokens.tolist() == [10, 11, 20, 40, 30]
    assert tree.parents.tolist() == [-1, -1, 0, 1, 2]
    deeper = best_first_tree(TOPK_IDS, probs, budget=7, branches=(b_ids, b_probs))
    assert 50 in deeper.tokens.tolist() and 21 in deeper.tokens.tolist()  # 11>40>50 (.216) and 10>21 (.24)


def test_ranked_tree_grafts_an_ngram_chain_by_hand():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]])
    # the chain 11 > 25 > 35 scores .8, .72, .36; the drafter's 11 (.3) then finds node 0 taken and
    # grows its own candidates under it (11>20 at .15); 10 (.6), 10>20 (.3), 10>20>30 (.27) as before
    ranked = ranked_tree(TOPK_IDS, probs, budget=6, chains=[([11, 25, 35], [0.8, 0.9, 0.5])])
    assert ranked.tree.tokens.tolist() == [11, 25, 10, 35, 20, 30]
    assert ranked.tree.parents.tolist() == [-1, 0, -1, 1, 2, 4]
    assert ranked.scores == pytest.approx([0.8, 0.72, 0.6, 0.36, 0.3, 0.27])
    assert ranked.chain_nodes == [[0, 1, 3]]
    bigger = ranked_tree(TOPK_IDS, probs, budget=9, chains=[([11, 25, 35], [0.8, 0.9, 0.5])])
    assert (0, 20) in set(zip(bigger.tree.parents.tolist(), bigger.tree.tokens.tolist()))  # 11>20 (.15) under the shared node
    # a chain along the drafter's own candidates shares their nodes (10 and 10>20, both taken by the
    # drafter first: 10 at .6 before the chain's .5, 10>20 at .3 before the chain's .25)
    shared = ranked_tree(TOPK_IDS, probs, budget=3, chains=[([10, 20], [0.5, 0.5])])
    assert shared.tree.tokens.tolist() == [10, 11, 20] and shared.chain_nodes == [[0, 2]]
    assert best_first_tree(TOPK_IDS, probs, budget=5).tokens.tolist() == ranked_tree(TOPK_IDS, probs, budget=5).tree.tokens.tolist()


def test_every_prefix_of_a_ranked_tree_is_a_tree():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(5, 4, generator=gen), -1).sort(-1, descending=True).values
    ids = torch.arange(20).reshape(5, 4)
    ranked = ranked_tree(ids, probs, budget=15, chains=[([0, 99, 98, 97], [0.7, 0.6, 0.5, 0.4])])
    assert ranked.scores == sorted(ranked.scores, reverse=True)
    for n in range(len(ranked.tree) + 1):
        assert len(truncate_tree(ranked.tree, n)) == n  # DraftTree checks parents come first


def test_malformed_trees_are_refused():
    with pytest.raises(ValueError, match="before"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([1, -1]), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="twice"):
        DraftTree(torch.tensor([1, 1]), torch.tensor([-1, -1]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="depth"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0]), torch.tensor([1, 3]))


def test_greedy_walk_follows_the_target_by_hand():
    tree = sibling_tree(TOPK_IDS, (3, 2, 1))
    # target after root: 10 (node 0); after node 0 (row 1): 21 (node 4); after node 4 (row 5): 99
    target = torch.tensor([10, 21, 0, 0, 0, 99, 0])
    assert accept_greedy(tree, target) == ([0, 4], 99)
    assert accept_greedy(tree, torch.tensor([12, 0, 0, 7, 0, 0, 0])) == ([2], 7)
    assert accept_greedy(tree, torch.tensor([13, 0, 0, 0, 0, 0, 0])) == ([], 13)


# ---------------------------------------------------------------------------- sampling exactness
VOCAB = 4
LAW = torch.tensor([  # a Markov target: p(next | last token)
    [0.10, 0.60, 0.20, 0.10],
    [0.50, 0.05, 0.25, 0.20],
    [0.30, 0.30, 0.30, 0.10],
    [0.05, 0.15, 0.40, 0.40],
])
ROOT = 2
LENGTH = 3


def markov_law_pvalue(counts: dict, samples: int) -> float:
    """Chi-square p-value of the counted LENGTH-token sequences after ROOT against LAW's exact joint law."""
    seqs = list(itertools.product(range(VOCAB), repeat=LENGTH))
    law = []
    for seq in seqs:
        p, last = 1.0, ROOT
        for t in seq:
            p, last = p * float(LAW[last, t]), t
        law.append(p)
    observed = [counts.get(s, 0) for s in seqs]
    expected = [p / sum(law) * samples for p in law]  # the law sums to 1 up to float rounding
    return chisquare(observed, expected).pvalue


def _round(tree, walk, generator):
    """One tree round after ROOT, continued by plain sampling to LENGTH tokens."""
    rows = [ROOT] + tree.tokens.tolist()
    probs = LAW[torch.tensor(rows)]  # the target's law after the root and after each node
    accepted, bonus = walk(tree, probs, generator)
    seq = [int(tree.tokens[i]) for i in accepted] + [bonus]
    while len(seq) < LENGTH:
        seq.append(int(torch.multinomial(LAW[seq[-1]], 1, generator=generator)))
    return tuple(seq[:LENGTH])


def _wrong_walk(tree, probs, generator):
    """Accepts the first child whenever the target's draw is any child: a sibling it did not draw."""
    accepted, node = [], -1
    while True:
        v = int(torch.multinomial(probs[node + 1], 1, generator=generator))
        kids = tree.children(node)
        if v not in kids:
            return accepted, v
        node = next(iter(kids.values()))
        accepted.append(node)


@pytest.mark.parametrize("walk,exact", [(accept_sampled, True), (_wrong_walk, False)])
def test_tree_walk_samples_the_targets_law(walk, exact):
    topk = torch.tensor([[1, 2, 0], [0, 2, 3], [1, 3, 2]])
    tree = best_first_tree(topk, torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.5, 0.3, 0.2]]), budget=8)
    assert tree.depth == 3 and any(len(tree.children(i)) > 1 for i in range(-1, len(tree)))
    g = torch.Generator().manual_seed(0)
    samples = 6000
    counts = {}
    for _ in range(samples):
        seq = _round(tree, walk, g)
        counts[seq] = counts.get(seq, 0) + 1
    pvalue = markov_law_pvalue(counts, samples)
    assert (pvalue > 1e-3) if exact else (pvalue < 1e-6)


# ---------------------------------------------------------------------------- sampled trees (multi-draft rejection)
Q = torch.tensor([  # the drafter's proposal per depth: close to the target, not equal
    [0.25, 0.25, 0.40, 0.10],
    [0.40, 0.30, 0.20, 0.10],
    [0.10, 0.20, 0.30, 0.40],
])
SHAPE = best_first_tree(torch.tensor([[1, 2, 0], [0, 2, 3], [1, 3, 2]]),
                        torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.5, 0.3, 0.2]]), budget=8)
FROM_CHAIN = [i == 1 for i in range(len(SHAPE))]  # node 1 (token 2 at depth 1) stands for an n-gram point mass


def test_sample_tree_by_hand_repeats_get_no_node():
    one_hot = torch.zeros(3, VOCAB)
    one_hot[:, 3] = 1.0  # every drafter draw is token 3
    shape = sibling_tree(TOPK_IDS, (3, 1, 1))  # root: 3 draws; the first draw's chain goes 2 deeper
    sampled = sample_tree(shape, [False] * len(shape), one_hot)
    # root: draws 3, 3 (repeat), 3 (repeat); node 0 (token 3) keeps the chain under the first draw
    assert sampled.tree.tokens.tolist() == [3, 3, 3]
    assert sampled.tree.parents.tolist() == [-1, 0, 1]
    assert sampled.draws[0] == [(3, 0, 0), (3, 0, -1), (3, 0, -1)]
    assert sampled.draws[1] == [(3, 1, 1)] and sampled.draws[2] == [(3, 2, 2)]
    assert sampled.origin == [0, 3, 4]


def test_sample_tree_keeps_point_masses_and_skips_empty_rows():
    q = Q.clone()
    q[1] = float("nan")  # depth 2 emptied by the processors: no draws there
    torch.manual_seed(0)
    sampled = sample_tree(SHAPE, FROM_CHAIN, q)
    assert 2 in sampled.tree.children(-1)  # the point mass kept its token
    assert int(sampled.tree.depths.max()) == 1 or all(
        FROM_CHAIN[sampled.origin[i]] for i in range(len(sampled.tree)) if int(sampled.tree.depths[i]) == 2)


def test_multidraft_acceptance_by_hand():
    # root with two draws of token 0 from q = [0.5, 0.5] and p = [0.2, 0.8]: the first is accepted
    # with p/q = 0.4; after a rejection the residual is norm(max(p - q, 0)) = [0, 1], so the repeat
    # is never accepted and the bonus is token 1.
    tree = DraftTree(torch.tensor([0]), torch.tensor([-1]), torch.tensor([1]))
    from hf_jetspec.generation.tree import SampledTree

    sampled = SampledTree(tree, [[(0, 0, 0), (0, 0, -1)], []], [0])
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.5]])
    torch.manual_seed(3)
    outcomes = [accept_multidraft(sampled, p, q) for _ in range(4000)]
    first = sum(1 for acc, _ in outcomes if acc == [0]) / len(outcomes)
    assert abs(first - 0.4) < 0.03
    assert all(bonus == 1 for acc, bonus in outcomes if not acc)


def _multidraft_walk(fault=None):
    def walk(tree, probs, generator):
        sampled = sample_tree(tree, FROM_CHAIN, Q)
        rows = [ROOT] + sampled.tree.tokens.tolist()
        target = LAW[torch.tensor(rows)]
        if fault is None:
            accepted, bonus = accept_multidraft(sampled, target, Q)
        else:
            accepted, bonus = _faulty_multidraft(sampled, target, Q, fault)
        return [sampled.tree.tokens[i] for i in accepted], bonus, sampled.tree
    return walk


def _faulty_multidraft(sampled, target, q_probs, fault):
    """accept_multidraft with a deliberate fault: ``"q/p"`` accepts with min(1, q/p);
    ``"no-residual"`` keeps verifying against p after a rejection and commits a draw of p."""
    accepted, node = [], -1
    while True:
        p = target[node + 1].clone()
        for token, row, child in sampled.draws[node + 1]:
            q = torch.zeros_like(p)
            q[token] = 1.0
            if row >= 0:
                q = q_probs[row]
            ratio = (q[token] / p[token]) if fault == "q/p" else (p[token] / q[token])
            if float(torch.rand(())) <= float(ratio) and child >= 0:
                accepted.append(child)
                node = child
                break
            if fault != "no-residual":
                p = torch.clamp(p - q, min=0)
                p = p / p.sum()
        else:
            return accepted, int(torch.multinomial(p, 1))


@pytest.mark.parametrize("fault", [None, "q/p", "no-residual"])
def test_sampled_tree_rounds_follow_the_targets_law(fault):
    """Drafter nodes drawn from Q (one draw per node of the shape, repeats merged), an n-gram point
    mass among the root's draws, verified by multi-draft rejection: the committed sequence follows
    LAW exactly; either fault is detected."""
    walk = _multidraft_walk(fault)
    torch.manual_seed(5)
    samples = 6000
    counts = {}
    for _ in range(samples):
        toks, bonus, _ = walk(SHAPE, None, None)
        seq = [int(t) for t in toks] + [bonus]
        while len(seq) < LENGTH:
            seq.append(int(torch.multinomial(LAW[seq[-1]], 1)))
        key = tuple(seq[:LENGTH])
        counts[key] = counts.get(key, 0) + 1
    pvalue = markov_law_pvalue(counts, samples)
    assert (pvalue > 1e-3) if fault is None else (pvalue < 1e-6)
