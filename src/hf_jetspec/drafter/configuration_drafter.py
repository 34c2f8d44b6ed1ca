"""Configuration of :class:`~hf_jetspec.JetSpecDrafter`."""

from __future__ import annotations

from transformers import PretrainedConfig

ATTENTION_KINDS = ("causal", "bidirectional")
ROW_TARGETS = ("next", "self")
BLOCK_INPUT_KINDS = ("tokens", "mask")


def default_target_layer_ids(num_target_layers: int, num_read_layers: int = 5) -> list[int]:
    """Target layers a drafter reads by default: evenly spread from layer 1 to layer L-3.

    This reproduces the DFlash choice for a 36-layer target, ``[1, 9, 17, 25, 33]``, and scales it
    to any depth (halves round up). Shallow targets read fewer, distinct layers.
    """
    if num_target_layers < 1:
        raise ValueError(f"a target needs at least one layer, got {num_target_layers}")
    first, last = min(1, num_target_layers - 1), max(num_target_layers - 3, 0)
    last = max(last, first)
    n = max(1, min(num_read_layers, last - first + 1))
    if n == 1:
        return [last]
    step = (last - first) / (n - 1)
    return sorted({int(first + i * step + 0.5) for i in range(n)})


def rope_theta_of(config) -> float:
    """Rotary base of a transformers text config (v5 keeps it in ``rope_parameters``)."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        # per-attention-type parameters (e.g. Gemma 3): use the full-attention entry
        entry = params.get("full_attention") or next(iter(params.values()))
        return float(entry.get("rope_theta", 10000.0))
    return float(getattr(config, "rope_theta", None) or 10000.0)


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


class JetSpecDrafterConfig(PretrainedConfig):
    r"""Configuration of a causal parallel block drafter.

    The drafter reads the hidden states of ``target_layer_ids`` of a frozen target, projects their
    concatenation to ``hidden_size`` and runs ``num_hidden_layers`` transformer layers in which
    the block positions attend to the projected context (as keys/values in every layer) and to
    each other. It shares the target's input embeddings and LM head, which are therefore not part
    of its weights.

    Args:
        target_model_type (`str`): ``model_type`` of the target the drafter was built for.
        target_hidden_size (`int`): hidden size of that target.
        target_vocab_size (`int`): vocabulary size of that target (also exposed as ``vocab_size``
            so that ``generate`` sees a shared tokenizer).
        target_num_hidden_layers (`int`): number of decoder layers of the target.
        target_layer_ids (`list[int]`): 0-based target decoder layers whose outputs are read.
        target_name_or_path (`str`, *optional*): where the target came from (informational).
        num_hidden_layers (`int`, defaults to 2): drafter transformer layers.
        num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
        rope_theta, attention_bias: shape of the drafter layers (by default the target's).
        attention (`str`, defaults to ``"causal"``): attention inside the block, ``"causal"``
            (JetSpec / JetSpec++) or ``"bidirectional"`` (DFlash).
        block_inputs (`str`, defaults to ``"tokens"``): what fills the not-yet-drafted block
            positions at the initial draft: real ``"tokens"`` drawn from the verified context
            (JetSpec++) or a learned ``"mask"`` embedding (DFlash / JetSpec).
        block_size (`int`, defaults to 16): block size used in training (anchor + 15 drafts). The
            verification budget at inference is independent of it.
        draft_vocab_size (`int`, *optional*): size of a reduced draft vocabulary; the ids are a
            buffer of the model (``draft_vocab``) and the LM head is restricted to those rows.
        qk_norm (`bool`, defaults to False): RMS-normalise each head's queries and keys before the
            rotation (``q_norm`` / ``k_norm``), as DFlash drafters do.
        context_input_norm (`bool`, defaults to True): pass the projected context through each
            layer's ``input_layernorm`` before its key/value projections (JetSpec); DFlash drafters
            project it directly (False).
        mask_token_id (`int`, *optional*): with ``block_inputs="mask"``, fill noise positions with the
            target's embedding of this token (DFlash) instead of a learned mask embedding.
        row_predicts (`str`, defaults to ``"next"``): which token a block row's output predicts: the
            one after the row (``"next"``, JetSpec) or the row's own (``"self"``, DFlash: row 0 holds
            the anchor and rows 1.. hold masks). A ``"self"`` drafter runs a block of L rows with one
            more trailing mask row, so that its outputs line up with a ``"next"`` drafter's.
        sliding_window (`int`, *optional*): a block position at sequence position ``p`` sees context
            positions ``t`` with ``p - t < sliding_window`` only (DFlash checkpoints with sliding
            attention); None: the whole context.

    The ``target_*`` signature fields may be None for a drafter converted from a format that does not
    record its target (MuseGlimmerAssistant); it then adopts the first target it is attached to.
    """

    model_type = "jetspec_drafter"

    def __init__(
        self,
        target_model_type: str = "llama",
        target_hidden_size: int = 64,
        target_vocab_size: int = 256,
        target_num_hidden_layers: int = 4,
        target_layer_ids: list[int] | None = None,
        target_name_or_path: str | None = None,
        hidden_size: int | None = None,
        num_hidden_layers: int = 2,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        intermediate_size: int | None = None,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        attention_bias: bool = False,
        attention: str = "causal",
        block_inputs: str = "tokens",
        block_size: int = 16,
        draft_vocab_size: int | None = None,
        qk_norm: bool = False,
        context_input_norm: bool = True,
        mask_token_id: int | None = None,
        row_predicts: str = "next",
        sliding_window: int | None = None,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        kwargs.pop("vocab_size", None)
        kwargs.setdefault("tie_word_embeddings", False)
        self.target_model_type = target_model_type
        self.target_hidden_size = int(target_hidden_size)
        self.target_vocab_size = _optional_int(target_vocab_size)
        self.target_num_hidden_layers = _optional_int(target_num_hidden_layers)
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(self.target_num_hidden_layers)
        self.target_layer_ids = [int(i) for i in target_layer_ids]
        self.target_name_or_path = target_name_or_path
        self.hidden_size = int(hidden_size or target_hidden_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.num_attention_heads = int(num_attention_heads)
        self.num_key_value_heads = int(num_key_value_heads or num_attention_heads)
        self.head_dim = int(head_dim or self.hidden_size // self.num_attention_heads)
        self.intermediate_size = int(intermediate_size or 4 * self.hidden_size)
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.attention_bias = bool(attention_bias)
        self.attention = attention
        self.block_inputs = block_inputs
        self.block_size = int(block_size)
        self.draft_vocab_size = _optional_int(draft_vocab_size)
        self.qk_norm = bool(qk_norm)
        self.context_input_norm = bool(context_input_norm)
        self.mask_token_id = _optional_int(mask_token_id)
        self.row_predicts = row_predicts
        self.sliding_window = _optional_int(sliding_window)
        self.initializer_range = initializer_range
        super().__init__(**kwargs)
        self.validate_drafter()

    @property
    def vocab_size(self) -> int:
        return self.target_vocab_size

    def validate_drafter(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        if self.block_inputs not in BLOCK_INPUT_KINDS:
            raise ValueError(f"block_inputs must be one of {BLOCK_INPUT_KINDS}, got {self.block_inputs!r}")
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        depth = self.target_num_hidden_layers
        bad = [i for i in self.target_layer_ids if i < 0 or (depth is not None and i >= depth)]
        if bad:
            raise ValueError(
                f"target_layer_ids {bad} are out of range for a target with {self.target_num_hidden_layers} "
                f"layers (valid: 0..{self.target_num_hidden_layers - 1})"
            )
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            raise ValueError(f"target_layer_ids must be distinct, got {self.target_layer_ids}")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(
                "the drafter shares the target's embeddings and LM head, so hidden_size must equal "
                f"target_hidden_size ({self.hidden_size} != {self.target_hidden_size})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one draft), got {self.block_size}")
        vocab = self.target_vocab_size
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= (vocab or self.draft_vocab_size):
            raise ValueError(f"draft_vocab_size must be in 1..{vocab}, got {self.draft_vocab_size}")
        if self.mask_token_id is not None:
            if self.block_inputs != "mask":
                raise ValueError("mask_token_id is used only by drafters with block_inputs='mask'")
            if not 0 <= self.mask_token_id < (vocab or self.mask_token_id + 1):
                raise ValueError(f"mask_token_id {self.mask_token_id} is not a token id of a vocabulary of {vocab}")
        if self.row_predicts not in ROW_TARGETS:
            raise ValueError(f"row_predicts must be one of {ROW_TARGETS}, got {self.row_predicts!r}")
        if self.row_predicts == "self" and self.block_inputs != "mask":
            raise ValueError("row_predicts='self' needs block_inputs='mask' (the extra row is a mask)")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive number of positions, got {self.sliding_window}")

    def unset_target_fields(self) -> list[str]:
        """The ``target_*`` signature fields this config leaves unset (None)."""
        return [k for k in ("target_model_type", "target_num_hidden_layers", "target_vocab_size") if getattr(self, k) is None]

    def adopt_target_fields(self, signature: dict) -> list[str]:
        """Fill the unset ``target_*`` fields from a target's ``signature`` (see
        :func:`~hf_jetspec.drafter.target_info.target_signature`), then validate; returns the fields filled."""
        filled = self.unset_target_fields()
        for key in filled:
            setattr(self, key, signature[key])
        if filled:
            self.validate_drafter()
        return filled

    def describe_target(self) -> str:
        name = f" ({self.target_name_or_path})" if self.target_name_or_path else ""
        return (
            f"a {self.target_model_type} target{name} with hidden_size={self.target_hidden_size}, "
            f"{self.target_num_hidden_layers} layers and vocab_size={self.target_vocab_size}"
        )
