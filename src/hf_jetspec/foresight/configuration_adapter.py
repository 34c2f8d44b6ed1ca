"""Configuration of :class:`~hf_jetspec.foresight.ForesightAdapter`."""

from __future__ import annotations

from transformers import PretrainedConfig


def default_source_layers(target_layer_ids: list[int], layers_per_module: int) -> list[list[int]]:
    """Target layers each adapter module starts from: the ``layers_per_module`` layers ending at its
    read layer, never reaching below the read layer of the module underneath.

    >>> default_source_layers([1, 8, 14], 2)
    [[0, 1], [7, 8], [13, 14]]
    >>> default_source_layers([0, 1], 3)
    [[0], [1]]
    """
    out, floor = [], 0
    for lid in target_layer_ids:
        first = max(floor, lid - layers_per_module + 1)
        out.append(list(range(first, lid + 1)))
        floor = lid + 1
    return out


class ForesightAdapterConfig(PretrainedConfig):
    r"""Configuration of the hidden-to-hidden foresight adapter (seed 000, Section 4.2, Appendix A).

    One module per target layer the drafter reads (``target_layer_ids``); module m is a stack of
    transformer layers (shaped like the target's and initialised from ``source_layers[m]``) that
    attends to the target's cached states at its layer and maps the prediction of the module below
    (the block's token embeddings for the lowest) to the predicted states of the block at its layer.

    Args:
        target_model_type, target_hidden_size, target_vocab_size, target_num_hidden_layers,
        target_name_or_path: the target served (checked on attach).
        target_layer_ids (`list[int]`): the read layers (the drafter's).
        source_layers (`list[list[int]]`, *optional*): target layers copied into each module.
        layers_per_module (`int`, defaults to 1): depth of each module when ``source_layers`` is
            not given.
        num_attention_heads, num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
        rope_theta, attention_bias: the target's layer shape.
        block_size (`int`, defaults to 16): positions predicted per call (the anchor and gamma
            draft tokens of the block under verification).
    """

    model_type = "jetspec_foresight_adapter"

    def __init__(
        self,
        target_model_type: str = "llama",
        target_hidden_size: int = 64,
        target_vocab_size: int = 128,
        target_num_hidden_layers: int = 4,
        target_layer_ids: list[int] | None = None,
        target_name_or_path: str | None = None,
        source_layers: list[list[int]] | None = None,
        layers_per_module: int = 1,
        hidden_size: int | None = None,
        num_attention_heads: int = 4,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        intermediate_size: int | None = None,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        attention_bias: bool = False,
        block_size: int = 16,
        initializer_range: float = 0.02,
        **kwargs,
    ):
        kwargs.pop("vocab_size", None)
        self.target_model_type = target_model_type
        self.target_hidden_size = int(target_hidden_size)
        self.target_vocab_size = int(target_vocab_size)
        self.target_num_hidden_layers = int(target_num_hidden_layers)
        self.target_layer_ids = [int(i) for i in (target_layer_ids or [target_num_hidden_layers - 1])]
        self.target_name_or_path = target_name_or_path
        self.layers_per_module = int(layers_per_module)
        self.source_layers = [list(map(int, s)) for s in (source_layers or default_source_layers(self.target_layer_ids, self.layers_per_module))]
        self.hidden_size = int(hidden_size or target_hidden_size)
        self.num_attention_heads = int(num_attention_heads)
        self.num_key_value_heads = int(num_key_value_heads or num_attention_heads)
        self.head_dim = int(head_dim or self.hidden_size // self.num_attention_heads)
        self.intermediate_size = int(intermediate_size or 4 * self.hidden_size)
        self.rms_norm_eps = float(rms_norm_eps)
        self.rope_theta = float(rope_theta)
        self.attention_bias = bool(attention_bias)
        self.block_size = int(block_size)
        self.initializer_range = initializer_range
        super().__init__(**kwargs)
        self.validate_adapter()

    def validate_adapter(self) -> None:
        ids = self.target_layer_ids
        if sorted(set(ids)) != ids:
            raise ValueError(f"target_layer_ids must be distinct and increasing, got {ids}")
        if not all(0 <= i < self.target_num_hidden_layers for i in ids):
            raise ValueError(f"target_layer_ids {ids} out of range for {self.target_num_hidden_layers} target layers")
        if len(self.source_layers) != len(ids) or any(len(s) == 0 for s in self.source_layers):
            raise ValueError("source_layers needs one non-empty list of target layers per read layer")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError("the adapter predicts target states, so hidden_size must equal target_hidden_size")
        if self.block_size < 2:
            raise ValueError("block_size must be >= 2")

    @property
    def vocab_size(self) -> int:
        return self.target_vocab_size

    def describe_target(self) -> str:
        name = f" ({self.target_name_or_path})" if self.target_name_or_path else ""
        return (
            f"a {self.target_model_type} target{name} with hidden_size={self.target_hidden_size}, "
            f"{self.target_num_hidden_layers} layers and vocab_size={self.target_vocab_size}"
        )
