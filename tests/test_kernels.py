"""The fused draft-head kernel against its torch reference, in Triton's interpreter on CPU."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_jetspec.kernels import head_summary, head_summary_torch, select_head_kernel, triton_available
from hf_jetspec.kernels.head_argmax import combine_partials

SRC = Path(__file__).resolve().parents[1] / "src"


def test_combine_partials_hand_checked():
    # one row, two tiles: tile maxima 1 and 3 (argmax 4 and 9), sums of exp(logit - tile max) 2 and 1
    s = combine_partials(torch.tensor([[1.0, 3.0]]), torch.tensor([[4, 9]]), torch.tensor([[2.0, 1.0]]))
    assert s.ids.tolist() == [9] and s.max_logit.tolist() == [3.0]
    assert s.log_norm.item() == pytest.approx(3 + math.log(1 + 2 * math.exp(-2)))
    # ties between tiles: the first maximal tile wins, as torch.argmax does
    assert combine_partials(torch.tensor([[2.0, 2.0]]), torch.tensor([[1, 7]]), torch.tensor([[1.0, 1.0]])).ids.tolist() == [1]


def test_torch_reference_and_cpu_choice():
    torch.manual_seed(0)
    hidden, weight = torch.randn(5, 16), torch.randn(40, 16)
    s = head_summary_torch(hidden, weight)
    logits = hidden @ weight.T
    assert torch.equal(s.ids, logits.argmax(-1))
    assert torch.allclose(s.top1_prob, torch.softmax(logits, -1).amax(-1), atol=1e-6)
    assert not select_head_kernel(hidden, weight)  # never on CPU
    assert torch.equal(head_summary(hidden, weight).ids, s.ids)


INTERPRETED = """
import torch
from hf_jetspec.kernels.head_argmax import head_summary_torch, head_summary_triton
torch.manual_seed(0)
for rows, vocab, width in [(15, 300, 64), (1, 130, 40), (33, 1000, 96)]:
    hidden, weight = torch.randn(rows, width), torch.randn(vocab, width)
    got, ref = head_summary_triton(hidden, weight, block_v=64, block_h=32), head_summary_torch(hidden, weight)
    assert torch.equal(got.ids, ref.ids), (rows, vocab, got.ids, ref.ids)
    assert torch.allclose(got.max_logit, ref.max_logit, atol=1e-4), (rows, vocab)
    assert torch.allclose(got.log_norm, ref.log_norm, atol=1e-4), (rows, vocab)
print("ok")
"""


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_triton_kernel_matches_torch_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(SRC))
    proc = subprocess.run([sys.executable, "-c", INTERPRETED], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
