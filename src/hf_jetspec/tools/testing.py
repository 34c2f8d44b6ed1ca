"""Tiny targets and a quickly fitted drafter, for mechanics checks (the test suite, the GPU check's exactness).

Random tiny models exercise every code path in seconds; a drafter fitted to a target's own greedy
continuations of random prompts accepts often on those prompts (tau ~ 3), so verification is really
exercised. Nothing here is a benchmark.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tiny_llama(vocab_size: int = 128, seed: int = 0, layers: int = 4, device=None):
    """A random 64-wide Llama (GQA 4/2) in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=0, eos_token_id=None, pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval().to(device or "cpu")


def tiny_qwen2(vocab_size: int = 160, seed: int = 1, device=None):
    """A random 64-wide, 5-layer Qwen2 (attention biases, untied head) in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=5,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=0, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).eval().to(device or "cpu")


def train_drafter_on_greedy(target, steps: int = 600, num_prompts: int = 32, gamma: int = 8, seed: int = 0, **overrides):
    """Fit a drafter to the target's greedy continuations of random prompts (clean-block CE).

    Returns ``(drafter, prompts)``; on those prompts the drafter accepts often (tau ~ 3).
    """
    from ..drafter.modeling_drafter import JetSpecDrafter

    device = target.device
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    torch.manual_seed(seed)
    drafter = JetSpecDrafter.for_target(target, **overrides)
    prompts = torch.randint(0, vocab, (num_prompts, 8), generator=g).to(device)
    with torch.no_grad():
        seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=56, min_new_tokens=56, do_sample=False)
        out = target(seqs, output_hidden_states=True)
        states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    opt = torch.optim.AdamW(drafter.parameters(), lr=5e-3)
    length = seqs.shape[1]
    drafter.train()
    for _ in range(steps):
        b = torch.randint(0, num_prompts, (8,), generator=g).to(device)
        anchors = torch.randint(4, length - gamma - 1, (8, 4), generator=g).to(device)
        idx = anchors[..., None] + torch.arange(gamma, device=device)
        s = seqs[b][:, None, :].expand(-1, 4, -1)
        inputs, labels = torch.gather(s, 2, idx), torch.gather(s, 2, idx + 1)
        logits = drafter(states[b], inputs, anchors).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval(), prompts
