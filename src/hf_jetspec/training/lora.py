"""Optional LoRA (peft) on the drafter's layers.

Useful when the drafter's layers start as copies of the target's (``init_layers_from_target``):
only low-rank updates of their projections train, with the context projection and the norms,
which are small, trained in full. The result is merged back into a plain
:class:`~hf_jetspec.JetSpecDrafter` before saving, so served drafters never depend on peft.
"""

from __future__ import annotations

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FULLY_TRAINED = ("fc", "context_norm", "input_layernorm", "post_attention_layernorm", "norm")


def lora_drafter(drafter, rank: int = 16, alpha: float | None = None, dropout: float = 0.0):
    """Wrap ``drafter`` in a peft model: LoRA of rank ``rank`` on its layers' projections, the rest frozen
    except the context projection and the norms. ``alpha`` defaults to ``2 * rank``."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, lora_dropout=dropout,
                        target_modules=list(LORA_TARGET_MODULES), bias="none")
    model = get_peft_model(drafter, config)
    for name, param in model.named_parameters():
        if any(part in FULLY_TRAINED for part in name.split(".")):
            param.requires_grad_(True)
    return model


def merged_drafter(model):
    """The plain drafter with the LoRA updates merged into its weights (a no-op for a plain drafter)."""
    if hasattr(model, "merge_and_unload"):
        return model.merge_and_unload()
    return model
