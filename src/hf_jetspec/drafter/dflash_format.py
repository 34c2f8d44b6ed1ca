"""DFlash interop: JetSpecDrafter weights to and from transformers' ``MuseGlimmerAssistantModel`` and the
DFlash release layout.

The three are one family: a few Llama-style layers over a projection (``fc`` + RMS norm) of the
concatenated states of the target layers ``target_layer_ids``; a block of ``block_size`` rows (the
anchor, then noise) attends to the projected context and to itself. A JetSpecDrafter matches them
exactly with ``attention="bidirectional"``, ``block_inputs="mask"``, ``mask_token_id`` set (noise =
the target's embedding of that token), ``qk_norm=True``, ``context_input_norm=False`` and
``row_predicts="self"`` (a mask row predicts its own token); the
conversions are renamings of the state dict plus a config, and refuse, naming the field, anything
the other side cannot express.

Every function here is pure: state dicts and config dicts in, state dicts and configs out.
"""

from __future__ import annotations

from .configuration_drafter import JetSpecDrafterConfig

MUSE_GLIMMER_MODEL_TYPE = "muse_glimmer_assistant"
DFLASH_ARCHITECTURE = "DFlashDraftModel"
UNSUPPORTED_DFLASH_ARCHITECTURES = {
    "DFlash2DraftModel": "its grouped dynamic convolutions and candidate selector have no JetSpecDrafter counterpart",
}

# JetSpecDrafter key -> key in each format (the layers share Llama names everywhere)
_MUSE_GLIMMER_KEYS = {"fc.weight": "encoder.fc.weight", "context_norm.weight": "encoder.output_norm_enc.weight", "norm.weight": "norm.weight"}
_DFLASH_KEYS = {"fc.weight": "fc.weight", "context_norm.weight": "hidden_norm.weight", "norm.weight": "norm.weight"}
_LAYER_PARAMS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight",
)


def checkpoint_format(config: dict) -> str:
    """``"jetspec"``, ``"muse_glimmer"`` or ``"dflash"`` for a checkpoint's ``config.json`` contents.

    Raises ``ValueError`` for DFlash variants that cannot be converted."""
    if config.get("model_type") == MUSE_GLIMMER_MODEL_TYPE:
        return "muse_glimmer"
    architectures = config.get("architectures") or []
    for arch in architectures:
        if arch in UNSUPPORTED_DFLASH_ARCHITECTURES:
            raise ValueError(f"cannot load a {arch} checkpoint as a JetSpecDrafter: {UNSUPPORTED_DFLASH_ARCHITECTURES[arch]}")
    if DFLASH_ARCHITECTURE in architectures or "dflash_config" in config:
        return "dflash"
    return "jetspec"


def dflash_layout_errors(config: JetSpecDrafterConfig) -> list[str]:
    """Why a JetSpecDrafter config has no DFlash / MuseGlimmerAssistant counterpart (empty if it has one)."""
    need = {
        "block_inputs": "mask",
        "qk_norm": True,
        "context_input_norm": False,
        "row_predicts": "self",
    }
    errors = [f"{k}={getattr(config, k)!r} (needs {v!r})" for k, v in need.items() if getattr(config, k) != v]
    if config.mask_token_id is None:
        errors.append("mask_token_id is None (noise must be the target's embedding of a mask token, not a learned vector)")
    if config.draft_vocab_size is not None:
        errors.append(f"draft_vocab_size={config.draft_vocab_size} (the other formats score the whole vocabulary)")
    return errors


def _require_dflash_layout(config: JetSpecDrafterConfig, fmt: str) -> None:
    errors = dflash_layout_errors(config)
    if errors:
        raise ValueError(
            f"this JetSpecDrafter cannot be written as a {fmt} checkpoint: " + "; ".join(errors)
            + ". Train it with the DFlash layout (examples/train_drafter.py --dflash-layout MASK_TOKEN_ID)."
        )


def _key_map(top: dict, num_layers: int) -> dict:
    """JetSpecDrafter key -> the other format's key: ``top`` plus the layer names both share."""
    mapping = dict(top)
    mapping.update({f"layers.{i}.{name}": f"layers.{i}.{name}" for i in range(num_layers) for name in _LAYER_PARAMS})
    return mapping


def _apply_key_map(state_dict: dict, mapping: dict, what: str) -> dict:
    """Rename ``state_dict`` by ``mapping``; every mapped key must be present and nothing else."""
    missing = [k for k in mapping if k not in state_dict]
    extra = [k for k in state_dict if k not in mapping]
    if missing or extra:
        raise ValueError(f"{what} does not have the expected weights: missing {missing[:6]}, unknown {extra[:6]}")
    return {mapping[k]: v for k, v in state_dict.items()}


def _rename(state_dict: dict, top: dict, num_layers: int) -> dict:
    """A JetSpecDrafter state dict in another format's key names."""
    return _apply_key_map(state_dict, _key_map(top, num_layers), "this drafter")


def _reverse(state_dict: dict, top: dict, num_layers: int, fmt: str) -> dict:
    """Inverse of :func:`_rename`: a checkpoint of another format -> JetSpecDrafter keys."""
    inverse = {v: k for k, v in _key_map(top, num_layers).items()}
    state_dict = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}
    return _apply_key_map(state_dict, inverse, f"this {fmt} checkpoint")


def _rope_theta(config: dict, fmt: str) -> float:
    params = config.get("rope_parameters") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default"):
        raise ValueError(f"{fmt} rope_type={rope_type!r} is not supported (JetSpecDrafter uses the default rotary embedding)")
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise ValueError(f"{fmt} rope_scaling={scaling!r} is not supported (JetSpecDrafter uses the default rotary embedding)")
    return float(params.get("rope_theta", config.get("rope_theta", 10000.0)))


def _single(values: list, what: str, fmt: str):
    if len(set(map(str, values))) != 1:
        raise ValueError(f"{fmt} layers differ in {what} ({values}); a JetSpecDrafter uses one for all layers")
    return values[0]


def _common_fields(config: dict, fmt: str) -> dict:
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{fmt} hidden_act={config['hidden_act']!r} is not supported (JetSpecDrafter layers use SiLU)")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    return dict(
        target_hidden_size=hidden,
        hidden_size=hidden,
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=int(config["intermediate_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(config, fmt),
        block_inputs="mask",
        qk_norm=True,
        context_input_norm=False,
        row_predicts="self",
    )


def _layer_shape(config: JetSpecDrafterConfig) -> dict:
    """The layer-shape fields both other formats write as transformers configs do."""
    return dict(
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_theta": config.rope_theta, "rope_type": "default"},
    )


# ---------------------------------------------------------------------------- MuseGlimmerAssistant
def jetspec_to_muse_glimmer(state_dict: dict, config: JetSpecDrafterConfig) -> tuple[dict, dict]:
    """A JetSpecDrafter's ``(state_dict, config)`` as a ``MuseGlimmerAssistantModel`` state dict and
    ``MuseGlimmerAssistantConfig`` keyword arguments."""
    _require_dflash_layout(config, "MuseGlimmerAssistant")
    if config.attention != "bidirectional":
        raise ValueError("MuseGlimmerAssistant attends bidirectionally inside the block: convert a drafter with attention='bidirectional'")
    if config.attention_bias:
        raise ValueError("MuseGlimmerAssistant projections have no bias: convert a drafter with attention_bias=False")
    window = config.sliding_window
    mg_config = dict(
        **_layer_shape(config),
        # its bidirectional window is inclusive (|q - k| <= w); ours is exclusive (|q - k| < w)
        layer_types=["full_attention" if window is None else "sliding_attention"] * config.num_hidden_layers,
        sliding_window=2048 if window is None else window - 1,
        hidden_act="silu",
        block_size=config.block_size,
        mask_token_id=config.mask_token_id,
        target_layer_ids=list(config.target_layer_ids),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return _rename(state_dict, _MUSE_GLIMMER_KEYS, config.num_hidden_layers), mg_config


def muse_glimmer_to_jetspec(state_dict: dict, mg_config: dict, target_fields: dict | None = None) -> tuple[dict, JetSpecDrafterConfig]:
    """A ``MuseGlimmerAssistantModel``'s state dict and ``config.json`` contents as a JetSpecDrafter's.

    The format does not record its target; ``target_fields`` (``target_model_type``,
    ``target_num_hidden_layers``, ``target_vocab_size``) fill that in, otherwise the drafter adopts
    the first target it is attached to."""
    fmt = "MuseGlimmerAssistant"
    fields = _common_fields(mg_config, fmt)
    layer_types = mg_config.get("layer_types") or ["sliding_attention"] * fields["num_hidden_layers"]
    kind = _single(layer_types, "layer_types", fmt)
    window = None
    if kind == "sliding_attention":
        window = int(mg_config.get("sliding_window") or 2048) + 1  # inclusive bidirectional window -> exclusive
    elif kind != "full_attention":
        raise ValueError(f"{fmt} layer type {kind!r} is not supported")
    fields.update(
        attention="bidirectional",
        block_size=int(mg_config.get("block_size", 16)),
        mask_token_id=int(mg_config["mask_token_id"]),
        target_layer_ids=list(mg_config["target_layer_ids"]),
        sliding_window=window,
        target_model_type=None,
        target_vocab_size=None,
        target_num_hidden_layers=None,
    )
    fields.update(target_fields or {})
    config = JetSpecDrafterConfig(**fields)
    return _reverse(state_dict, _MUSE_GLIMMER_KEYS, config.num_hidden_layers, fmt=fmt), config


# ---------------------------------------------------------------------------- DFlash release layout
def _dflash_value(config: dict, name: str, default=None):
    """A field of a DFlash config: ``dflash_config`` first, then the top level."""
    return (config.get("dflash_config") or {}).get(name, config.get(name, default))


def dflash_to_jetspec(state_dict: dict, dflash_config: dict, target_fields: dict | None = None) -> tuple[dict, JetSpecDrafterConfig]:
    """A DFlash release checkpoint (``DFlashDraftModel``: ``fc``, ``hidden_norm``, Qwen3-style layers with
    q/k norms, ``norm``; ``dflash_config`` with ``target_layer_ids`` and ``mask_token_id``) as a
    JetSpecDrafter's state dict and config."""
    fmt = "DFlash"
    if checkpoint_format(dflash_config) != "dflash":
        raise ValueError("not a DFlash draft-model config (no DFlashDraftModel architecture or dflash_config)")
    for name, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None)):
        value = _dflash_value(dflash_config, name, neutral)
        if value not in (neutral, 0, 0.0) and value is not None:
            raise ValueError(f"DFlash {name}={value} is not supported (a JetSpecDrafter uses the target's embeddings and LM head as they are)")
    layer_ids = _dflash_value(dflash_config, "target_layer_ids")
    mask_id = _dflash_value(dflash_config, "mask_token_id")
    if layer_ids is None or mask_id is None:
        raise ValueError("a DFlash config must define dflash_config.target_layer_ids and dflash_config.mask_token_id")
    fields = _common_fields(dflash_config, fmt)
    n = fields["num_hidden_layers"]
    layer_types = dflash_config.get("layer_types")
    if layer_types is None:
        if dflash_config.get("use_sliding_window"):
            raise ValueError("this DFlash config uses sliding windows without listing layer_types; add layer_types to it")
        layer_types = ["full_attention"] * n
    is_causal = dflash_config.get("is_causal")
    causal = _single([t == "sliding_attention" if is_causal is None else bool(is_causal) for t in layer_types], "causality", fmt)
    windows = [dflash_config.get("sliding_window") if t == "sliding_attention" else None for t in layer_types]
    window = _single(windows, "sliding windows", fmt)
    bias = bool(dflash_config.get("attention_bias", False))
    if bias:
        raise ValueError("DFlash attention_bias=True adds an output-projection bias, which a JetSpecDrafter does not have")
    fields.update(
        attention="causal" if causal else "bidirectional",
        block_size=int(_dflash_value(dflash_config, "block_size", 16)),
        mask_token_id=int(mask_id),
        target_layer_ids=list(layer_ids),
        sliding_window=None if window is None else int(window),
        target_model_type=None,
        target_vocab_size=dflash_config.get("vocab_size"),
        target_num_hidden_layers=dflash_config.get("num_target_layers"),
    )
    fields.update(target_fields or {})
    config = JetSpecDrafterConfig(**fields)
    return _reverse(state_dict, _DFLASH_KEYS, n, fmt=fmt), config


def jetspec_to_dflash(state_dict: dict, config: JetSpecDrafterConfig) -> tuple[dict, dict]:
    """A JetSpecDrafter as a DFlash release checkpoint (state dict and ``config.json`` contents)."""
    _require_dflash_layout(config, "DFlash")
    if config.attention_bias:
        raise ValueError("a DFlash attention_bias also biases the output projection: convert a drafter with attention_bias=False")
    layer_type = "full_attention" if config.sliding_window is None else "sliding_attention"
    dflash = dict(
        architectures=[DFLASH_ARCHITECTURE],
        model_type="qwen3",
        **_layer_shape(config),
        hidden_act="silu",
        attention_bias=False,
        layer_types=[layer_type] * config.num_hidden_layers,
        sliding_window=config.sliding_window,
        use_sliding_window=config.sliding_window is not None,
        is_causal=config.attention == "causal",
        block_size=config.block_size,
        num_target_layers=config.target_num_hidden_layers,
        vocab_size=config.target_vocab_size,
        dflash_config={"mask_token_id": config.mask_token_id, "target_layer_ids": list(config.target_layer_ids)},
    )
    return _rename(state_dict, _DFLASH_KEYS, config.num_hidden_layers), dflash


def convert_to_jetspec(state_dict: dict, config: dict, target_fields: dict | None = None) -> tuple[dict, JetSpecDrafterConfig, str]:
    """Any supported checkpoint's ``(state_dict, config.json contents)`` -> JetSpecDrafter's, plus the format name."""
    fmt = checkpoint_format(config)
    if fmt == "muse_glimmer":
        return (*muse_glimmer_to_jetspec(state_dict, config, target_fields), fmt)
    if fmt == "dflash":
        return (*dflash_to_jetspec(state_dict, config, target_fields), fmt)
    raise ValueError("this is a JetSpecDrafter checkpoint already")


def muse_glimmer_assistant(drafter):
    """transformers' ``MuseGlimmerAssistantModel`` with a JetSpecDrafter's converted weights (same dtype
    and device), ready for ``generate(..., assistant_model=..., speculation_type="dflash")``."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    state, kwargs = jetspec_to_muse_glimmer(drafter.state_dict(), drafter.config)
    model = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(**kwargs))
    model.load_state_dict(state, strict=True)
    return model.to(device=drafter.device, dtype=drafter.dtype).eval()
