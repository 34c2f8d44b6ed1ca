"""What add-ons need to know about a target: its signature, backbone, layers and attention shape.

A low module (it imports nothing of the package but the config helpers), shared by the drafter,
the foresight adapters and decoder, and the numerics tools.
"""

from __future__ import annotations

from torch import nn

from .configuration_drafter import default_target_layer_ids, rope_theta_of


def target_signature(target) -> dict:
    """What a drafter must agree with: architecture, widths, depth and vocabulary of a target."""
    cfg = target.config.get_text_config()
    return {
        "target_model_type": cfg.model_type,
        "target_hidden_size": cfg.hidden_size,
        "target_num_hidden_layers": cfg.num_hidden_layers,
        "target_vocab_size": cfg.vocab_size,
    }


def target_backbone(target) -> nn.Module:
    """The decoder stack of a ``*ForCausalLM`` target (the module holding its layers, final norm and rotary)."""
    return target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", target)


def attention_shape(target) -> tuple[int, int, int]:
    """``(num_heads, num_kv_heads, head_dim)`` of a target's attention layers."""
    cfg = target.config.get_text_config()
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return heads, kv_heads, head_dim


def target_decoder_layers(target) -> nn.ModuleList:
    layers = getattr(target_backbone(target), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(target).__name__}")
    return layers


def check_servable(target) -> None:
    """A clear error for a target a drafter cannot serve: drafters read a decoder-only target's hidden
    states, and verification rolls its key/value cache back to the accepted prefix."""
    name = type(target).__name__
    if getattr(target.config, "is_encoder_decoder", False):
        raise ValueError(f"a drafter cannot serve {name}: it is an encoder-decoder model; JetSpec drafts for decoder-only "
                         "causal language models")
    layers = getattr(target_backbone(target), "layers", None)
    if layers is None or not len(layers) or not all(hasattr(layer, "self_attn") for layer in layers):
        raise ValueError(f"a drafter cannot serve {name}: not every decoder layer is an attention layer (state-space and "
                         "hybrid layers keep a recurrent state that verification cannot roll back to the accepted tokens)")


def target_shape_fields(target) -> dict:
    """Config fields shared by every add-on of ``target``: its signature and its layers' shape."""
    check_servable(target)
    cfg = target.config.get_text_config()
    heads, kv_heads, head_dim = attention_shape(target)
    first_layer = target_decoder_layers(target)[0]
    q_proj = getattr(getattr(first_layer, "self_attn", None), "q_proj", None)
    return dict(
        target_model_type=cfg.model_type,
        target_hidden_size=cfg.hidden_size,
        target_vocab_size=cfg.vocab_size,
        target_num_hidden_layers=cfg.num_hidden_layers,
        target_layer_ids=default_target_layer_ids(cfg.num_hidden_layers),
        target_name_or_path=getattr(target, "name_or_path", None) or getattr(cfg, "_name_or_path", None),
        hidden_size=cfg.hidden_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6),
        rope_theta=rope_theta_of(cfg),
        attention_bias=bool(q_proj is not None and q_proj.bias is not None),
    )


def check_target_matches(config, target, kind: str, builder: str, noun: str) -> None:
    """Raise a ``ValueError`` naming both sides if ``target`` differs from the one ``config`` records.

    ``kind`` is the class name shown in the message, ``noun`` the plain word ("drafter").
    """
    sig = target_signature(target)
    diffs = [
        f"{key[len('target_'):]}: {noun} built for {getattr(config, key)!r}, target has {value!r}"
        for key, value in sig.items()
        if getattr(config, key) != value
    ]
    if diffs:
        name = getattr(target, "name_or_path", "") or type(target).__name__
        raise ValueError(
            f"This {kind} was built for {config.describe_target()}, but it was given the target "
            f"{name!r} ({sig['target_model_type']}, hidden_size={sig['target_hidden_size']}, "
            f"{sig['target_num_hidden_layers']} layers, vocab_size={sig['target_vocab_size']}). Mismatch in "
            + "; ".join(diffs)
            + f". Use a {noun} trained for this target, or build one with {builder}."
        )
    if target.get_input_embeddings() is None or target.get_output_embeddings() is None:
        raise ValueError("the target must expose input and output embeddings (a *ForCausalLM model)")
