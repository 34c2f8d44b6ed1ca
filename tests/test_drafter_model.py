"""JetSpecDrafter as a PreTrainedModel: construction, checkpoints, the target it serves, bad input."""

import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel

from hf_jetspec import DraftingConfig, JetSpecDrafter, JetSpecDrafterConfig
from hf_jetspec.drafter.modeling_drafter import mlp_neuron_ranking
from helpers import tiny_llama, tiny_qwen2


def test_for_target_records_the_target(llama_target):
    drafter = JetSpecDrafter.for_target(llama_target, num_hidden_layers=1)
    cfg = drafter.config
    assert (cfg.target_model_type, cfg.target_hidden_size, cfg.target_vocab_size, cfg.target_num_hidden_layers) == ("llama", 64, 128, 4)
    assert cfg.vocab_size == 128  # generate() compares vocab sizes to decide on a shared tokenizer
    assert len(drafter.layers) == 1
    with pytest.raises(TypeError, match="unknown JetSpecDrafterConfig field"):
        JetSpecDrafter.for_target(llama_target, num_layerz=3)


def test_shared_weights_are_not_parameters_or_saved(tmp_path, llama_target):
    drafter = JetSpecDrafter.for_target(llama_target)
    names = {n for n, _ in drafter.named_parameters()}
    assert not any("embed" in n or "lm_head" in n for n in names)
    n_params = sum(p.numel() for p in drafter.parameters())
    drafter.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    saved = load_file(tmp_path / "model.safetensors")
    assert sum(t.numel() for t in saved.values()) == n_params
    assert not any("embed" in k or "lm_head" in k for k in saved)


def test_save_load_round_trip(tmp_path, trained_llama):
    target, drafter, prompts = trained_llama
    drafter.drafting_config = DraftingConfig(budget=8, num_jacobi_passes=2, seed=3, policy=False)  # fixed rounds: comparable stats
    drafter.save_pretrained(tmp_path)
    loaded = JetSpecDrafter.from_pretrained(tmp_path).eval()
    assert loaded.drafting_config == drafter.drafting_config
    for (n1, p1), (n2, p2) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    a = target.generate(prompts[:1], assistant_model=drafter, do_sample=False, max_new_tokens=30)
    stats_a = drafter.generation_stats
    b = target.generate(prompts[:1], assistant_model=loaded, do_sample=False, max_new_tokens=30)
    assert torch.equal(a, b) and loaded.generation_stats.accepted_lengths == stats_a.accepted_lengths
    # options at from_pretrained, and through the Auto classes
    again = JetSpecDrafter.from_pretrained(tmp_path, num_jacobi_passes=0, budget=32)
    assert (again.drafting_config.num_jacobi_passes, again.drafting_config.budget, again.drafting_config.seed) == (0, 32, 3)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), JetSpecDrafterConfig)
    assert isinstance(AutoModel.from_pretrained(tmp_path), JetSpecDrafter)


def test_fp16_checkpoint_serves_fp32_target(tmp_path, trained_llama):
    target, drafter, prompts = trained_llama
    copy = JetSpecDrafter(drafter.config)
    copy.load_state_dict(drafter.state_dict())
    copy.half().save_pretrained(tmp_path)
    half = JetSpecDrafter.from_pretrained(tmp_path, dtype=torch.float16).eval()
    assert half.dtype == torch.float16
    ref = target.generate(prompts[:1], do_sample=False, max_new_tokens=30)
    out = target.generate(prompts[:1], assistant_model=half, do_sample=False, max_new_tokens=30)
    assert torch.equal(ref, out)


def test_wrong_target_names_both(llama_target, qwen_target):
    drafter = JetSpecDrafter.for_target(llama_target)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"built for a llama target.*qwen2.*Mismatch in"):
        qwen_target.generate(prompt, assistant_model=drafter, max_new_tokens=5)


def test_mismatched_vocabulary_is_rejected(llama_target):
    other = tiny_llama(vocab_size=130, seed=4)
    drafter = JetSpecDrafter.for_target(llama_target)
    with pytest.raises(ValueError, match=r"vocab_size: drafter built for 128, target has 130"):
        other.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=5)


def test_out_of_range_layer_ids(llama_target):
    with pytest.raises(ValueError, match="out of range for a target with 4 layers"):
        JetSpecDrafter.for_target(llama_target, target_layer_ids=[1, 4])
    with pytest.raises(ValueError, match="out of range"):
        JetSpecDrafterConfig(target_num_hidden_layers=4, target_layer_ids=[-1])
    with pytest.raises(ValueError, match="distinct"):
        JetSpecDrafterConfig(target_num_hidden_layers=4, target_layer_ids=[1, 1])


def test_bad_config_switches():
    with pytest.raises(ValueError, match="attention must be one of"):
        JetSpecDrafterConfig(attention="sideways")
    with pytest.raises(ValueError, match="block_inputs must be one of"):
        JetSpecDrafterConfig(block_inputs="noise")
    with pytest.raises(ValueError, match="hidden_size must equal"):
        JetSpecDrafterConfig(target_hidden_size=64, hidden_size=32)


def test_bad_drafting_options(llama_target):
    with pytest.raises(ValueError, match="budget must be"):
        DraftingConfig(budget=1)
    with pytest.raises(ValueError, match="num_jacobi_passes"):
        DraftingConfig(num_jacobi_passes=-1)
    drafter = JetSpecDrafter.for_target(llama_target)
    drafter.drafting_config.budget = 0  # set by attribute: validated when generate starts
    with pytest.raises(ValueError, match="budget must be"):
        llama_target.generate(torch.tensor([[1, 2]]), assistant_model=drafter, max_new_tokens=4)
    with pytest.raises(TypeError, match="unknown drafting option"):
        DraftingConfig().replace(jacobi=3)
    for bad in (0, -1.0, float("inf"), True, "2"):
        with pytest.raises(ValueError, match="proposal_sharpness"):
            DraftingConfig(proposal_sharpness=bad)
    for bad in (-0.1, True, "1"):
        with pytest.raises(ValueError, match="sampled_drafts_min_temperature"):
            DraftingConfig(sampled_drafts_min_temperature=bad)


def test_drafts_are_drawn_from_q_only_when_sampling_at_or_above_the_threshold():
    from transformers import GenerationConfig

    options = DraftingConfig(sampled_drafts_min_temperature=0.85)
    assert not options.draws_from_q(GenerationConfig(do_sample=False))
    assert not options.draws_from_q(GenerationConfig(do_sample=True, temperature=0.7))
    assert options.draws_from_q(GenerationConfig(do_sample=True, temperature=0.85))
    assert options.draws_from_q(GenerationConfig(do_sample=True, temperature=1.0))
    assert not options.replace(sampled_drafts=False).draws_from_q(GenerationConfig(do_sample=True, temperature=1.0))
    assert DraftingConfig().draws_from_q(GenerationConfig(do_sample=True, temperature=0.2))


def test_unsupported_generation_settings(llama_target):
    drafter = JetSpecDrafter.for_target(llama_target)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="num_beams=1"):
        llama_target.generate(prompt, assistant_model=drafter, num_beams=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_return_sequences has to be 1"):
        llama_target.generate(prompt, assistant_model=drafter, do_sample=True, num_return_sequences=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="left padding"):  # several rows batch (tests/test_batched_decoding.py); right padding does not
        llama_target.generate(torch.tensor([[1, 2, 3], [4, 5, 0]]), attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
                              assistant_model=drafter, max_new_tokens=4, pad_token_id=0)
    with pytest.raises(ValueError, match="unpadded prompt"):
        llama_target.generate(prompt, attention_mask=torch.tensor([[0, 1, 1]]), assistant_model=drafter, max_new_tokens=4)
    with pytest.raises(ValueError, match="assistant_ensemble_weight"):
        llama_target.generate(prompt, assistant_model=drafter, do_sample=True, assistant_ensemble_weight=0.5, max_new_tokens=4)


def test_missing_and_corrupt_weights(tmp_path, llama_target):
    drafter = JetSpecDrafter.for_target(llama_target)
    drafter.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError, match="corrupt or truncated"):
        JetSpecDrafter.from_pretrained(tmp_path)
    weights.write_bytes(b"\x00" * 16)
    with pytest.raises(OSError, match="corrupt or truncated"):
        JetSpecDrafter.from_pretrained(tmp_path)
    weights.unlink()
    with pytest.raises(OSError, match="model.safetensors"):
        JetSpecDrafter.from_pretrained(tmp_path)
    with pytest.raises(OSError):
        JetSpecDrafter.from_pretrained(tmp_path / "nowhere")


def test_init_layers_from_target():
    target = tiny_qwen2()
    drafter = JetSpecDrafter.for_target(target, num_hidden_layers=2, init_layers_from_target=True)
    top = target.model.layers[-1]
    assert drafter.config.attention_bias  # Qwen2 projections carry biases
    assert torch.equal(drafter.layers[-1].self_attn.q_proj.weight, top.self_attn.q_proj.weight)
    assert torch.equal(drafter.layers[-1].self_attn.q_proj.bias, top.self_attn.q_proj.bias)
    assert torch.equal(drafter.layers[0].mlp.down_proj.weight, target.model.layers[-2].mlp.down_proj.weight)


def test_mlp_neuron_ranking_by_hand():
    # neuron scores |gate_i| * |up_i| * |down_:,i|: 1*1*1 = 1, 2*1*3 = 6, 1*2*1 = 2
    gate = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    up = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    down = torch.tensor([[1.0, 3.0, 0.0], [0.0, 0.0, 1.0]])
    assert mlp_neuron_ranking(gate, up, down).tolist() == [1, 2, 0]


def test_init_layers_from_target_with_a_narrower_mlp():
    target = tiny_qwen2()
    top = target.model.layers[-1].mlp
    width = top.down_proj.weight.shape[1] // 2
    drafter = JetSpecDrafter.for_target(target, num_hidden_layers=1, intermediate_size=width, init_layers_from_target=True)
    keep = mlp_neuron_ranking(top.gate_proj.weight, top.up_proj.weight, top.down_proj.weight)[:width].sort().values
    mine = drafter.layers[0].mlp
    assert torch.equal(mine.gate_proj.weight, top.gate_proj.weight[keep])
    assert torch.equal(mine.up_proj.weight, top.up_proj.weight[keep])
    assert torch.equal(mine.down_proj.weight, top.down_proj.weight[:, keep])
    assert torch.equal(drafter.layers[0].self_attn.o_proj.weight, target.model.layers[-1].self_attn.o_proj.weight)


def test_training_forward_matches_incremental_drafting(trained_llama):
    """The packed training view and the cached inference view compute the same drafts."""
    from hf_jetspec.drafter.drafter_cache import DrafterCache

    target, drafter, prompts = trained_llama
    seq = target.generate(prompts[:1], do_sample=False, max_new_tokens=20)
    with torch.no_grad():
        out = target(seq, output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    anchors = torch.tensor([[10, 17]])
    blocks = torch.stack([seq[0, 10:16], seq[0, 17:23]])[None]
    with torch.no_grad():
        packed = drafter(states, blocks, anchors).logits.argmax(-1)[0]
    for b, a in enumerate(anchors[0].tolist()):
        cache = DrafterCache(drafter.config.num_hidden_layers)
        drafter.append_context(cache, states[:, :a], torch.arange(a))
        assert torch.equal(drafter.draft_block(cache, blocks[0, b], a), packed[b])


@pytest.mark.parametrize("row_predicts", ["self", "next"])
def test_a_truncated_training_block_equals_the_shorter_block(row_predicts):
    """A bidirectional drafter trained on blocks drafted shorter (``draft_lengths``) sees in them
    exactly what it sees when it drafts that many tokens: the packed view of a 6-input block cut to k
    gives the outputs of a k-input block, for its first k slots."""
    target = tiny_llama()
    torch.manual_seed(0)
    extra = {"block_inputs": "mask", "mask_token_id": 3, "qk_norm": True, "context_input_norm": False} if row_predicts == "self" else {}
    drafter = JetSpecDrafter.for_target(target, attention="bidirectional", row_predicts=row_predicts, block_size=7, **extra).eval()
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, target.config.vocab_size, (1, 30), generator=g)
    with torch.no_grad():
        out = target(seq, output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    anchors = torch.tensor([[8, 14, 20]])
    blocks = torch.stack([seq[0, a:a + 6] for a in anchors[0].tolist()])[None]
    noise = torch.zeros(blocks.shape, dtype=torch.bool)
    noise[..., 1:] = True
    lengths = torch.tensor([[6, 2, 4]])
    with torch.no_grad():
        cut = drafter(states, blocks, anchors, noise, draft_lengths=lengths).logits[0]
        whole = drafter(states, blocks, anchors, noise).logits[0]
        for b, k in enumerate(lengths[0].tolist()):
            alone = drafter(states, blocks[:, b:b + 1, :k], anchors[:, b:b + 1], noise[:, b:b + 1, :k]).logits[0, 0]
            torch.testing.assert_close(cut[b, :k], alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(cut[1, :2], whole[1, :2])  # bidirectional rows did see the rows the cut removed


def test_restricted_draft_vocab_is_exact_and_round_trips(tmp_path, trained_llama):
    target, drafter, prompts = trained_llama
    small = JetSpecDrafter(drafter.config.__class__(**drafter.config.to_dict()))
    small.load_state_dict(drafter.state_dict())
    small.attach_target(target)
    small.restrict_draft_vocab(range(0, 128, 2))  # only even ids can be drafted
    assert small.config.draft_vocab_size == 64
    ref = target.generate(prompts[:1], do_sample=False, max_new_tokens=40)
    out = target.generate(prompts[:1], assistant_model=small, do_sample=False, max_new_tokens=40)
    assert torch.equal(ref, out)
    small.save_pretrained(tmp_path)
    loaded = JetSpecDrafter.from_pretrained(tmp_path)
    assert loaded.config.draft_vocab_size == 64 and torch.equal(loaded.draft_vocab, torch.arange(0, 128, 2))
    with pytest.raises(ValueError, match="draft vocabulary ids"):
        small.restrict_draft_vocab([200])
    small.widen_draft_vocab([3, 2, 5, 7, 9], 67)  # 2 is held already: 3, 5 and 7 join, 9 does not
    assert small.config.draft_vocab_size == 67 and small.draft_vocab.tolist() == sorted([*range(0, 128, 2), 3, 5, 7])
    out = target.generate(prompts[:1], assistant_model=small, do_sample=False, max_new_tokens=40)
    assert torch.equal(ref, out)
    with pytest.raises(ValueError, match="cannot widen"):
        small.widen_draft_vocab([1], 10)
    with pytest.raises(ValueError, match="whole vocabulary"):
        drafter.widen_draft_vocab([1], 10)


@pytest.mark.parametrize("from_target", [False, True])
def test_grown_drafter_drafts_exactly_as_before_and_saves(tmp_path, trained_llama, from_target):
    target, drafter, prompts = trained_llama
    grown = JetSpecDrafter(drafter.config.__class__(**drafter.config.to_dict()))
    grown.load_state_dict(drafter.state_dict())
    grown.attach_target(target)
    depth = drafter.config.num_hidden_layers
    grown.grow_layers(2, target=target if from_target else None)
    assert len(grown.layers) == grown.config.num_hidden_layers == depth + 2
    new = grown.layers[-1]
    assert not new.self_attn.o_proj.weight.any() and not new.mlp.down_proj.weight.any()
    assert new.self_attn.q_proj.weight.any()  # only the residual outputs start at zero
    if from_target:
        assert torch.equal(new.self_attn.q_proj.weight, target.model.layers[-1].self_attn.q_proj.weight)
    seq = target.generate(prompts[:1], do_sample=False, max_new_tokens=20)
    with torch.no_grad():
        out = target(seq, output_hidden_states=True)
    states = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    anchors, blocks = torch.tensor([[10]]), seq[0, 10:16][None, None]
    with torch.no_grad():
        assert torch.allclose(grown(states, blocks, anchors).logits, drafter(states, blocks, anchors).logits, atol=1e-5)
    grown.save_pretrained(tmp_path)
    assert JetSpecDrafter.from_pretrained(tmp_path).config.num_hidden_layers == depth + 2
    with pytest.raises(ValueError, match="at least one"):
        grown.grow_layers(0)
