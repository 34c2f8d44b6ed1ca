"""JetSpecDrafter: a causal parallel block drafter that reads a frozen target's hidden states."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput, logging

from .configuration_drafter import JetSpecDrafterConfig
from .dflash_format import checkpoint_format
from .drafter_cache import BlockAttention, DrafterCache
from .row_contexts import RowContexts
from .drafting_config import DRAFTING_CONFIG_NAME, DraftingConfig
from .int8_drafting import Int8Head, check_int8_device, int8_linear, is_quantized, quantize_linear, restore_linear
from ..kernels import head_summary, summarise_logits
from .layers import DecoderLayer, RMSNorm, RotaryTable
from .masks import PackedBlocks, context_visibility, sliding_window_mask
from .target_info import check_target_matches, target_decoder_layers, target_shape_fields, target_signature
from .hub_files import companion_file, hub_options
from .weight_storage import WEIGHT_STORAGES

logger = logging.get_logger(__name__)


@dataclass
class JetSpecDrafterOutput(ModelOutput):
    """``logits`` over the draft vocabulary for every block position: [B, num_blocks, gamma, V_draft]."""

    logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


class JetSpecDrafter(PreTrainedModel):
    """Causal parallel block drafter (JetSpec++), usable as ``assistant_model`` of ``generate``.

    The drafter is an add-on of one target: it reads the target's hidden states at
    ``config.target_layer_ids`` and shares the target's input embeddings and LM head by reference
    (they are attached at generation time and never saved with the drafter). Build a fresh one
    with :meth:`for_target`; load a trained one with ``from_pretrained``.

    Drafting options live in ``drafter.drafting_config`` (:class:`~hf_jetspec.DraftingConfig`);
    the statistics of the latest ``generate`` call in ``drafter.generation_stats`` (None before the
    first call). What serves the drafter beside its weights (the round policy's acceptance
    calibrations, the output memory, a foresight adapter) is composed with it one floor up, in
    :class:`~hf_jetspec.assistant.JetSpecAssistant`; ``generate`` composes one on first use.
    """

    config_class = JetSpecDrafterConfig
    base_model_prefix = "drafter"
    main_input_name = "block_input_ids"
    _no_split_modules = ["DecoderLayer"]

    def __init__(self, config: JetSpecDrafterConfig):
        super().__init__(config)
        n_read = len(config.target_layer_ids)
        self.fc = nn.Linear(n_read * config.target_hidden_size, config.hidden_size, bias=False)
        self.context_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer.from_config(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.block_inputs == "mask" and config.mask_token_id is None:
            self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        if config.draft_vocab_size is not None:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size, dtype=torch.long), persistent=True)
        self.drafting_config = DraftingConfig()
        self.generation_stats = None  # the latest generate call's statistics, handed over by its generator
        self.pretrained_source = None  # (name or path, Hub options) of from_pretrained: where companion files live
        # The target is referenced, not registered: its weights are not ours to save or train.
        self.__dict__["_target"] = None
        self.__dict__["_head_weight"] = None
        self.__dict__["_int8_head"] = None  # set_int8_drafting
        self.__dict__["_compile_on"] = False  # compile_drafting
        self._rotary_table = RotaryTable(config.head_dim, config.rope_theta)
        self.post_init()

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, JetSpecDrafter):
            if hasattr(module, "mask_embedding"):
                nn.init.normal_(module.mask_embedding, mean=0.0, std=std)
            if hasattr(module, "draft_vocab"):
                module.draft_vocab.copy_(torch.arange(module.config.draft_vocab_size, device=module.draft_vocab.device))

    # ------------------------------------------------------------------ construction / loading
    @classmethod
    def for_target(cls, target, *, init_layers_from_target: bool = False, **overrides) -> "JetSpecDrafter":
        """A freshly initialised drafter for ``target``; ``overrides`` set config fields.

        With ``init_layers_from_target=True`` the drafter layers start as copies of the target's
        top decoder layers (Llama/Qwen2-style targets).
        """
        values = target_shape_fields(target)
        unknown = set(overrides) - set(JetSpecDrafterConfig().to_dict()) - set(values)
        if unknown:
            raise TypeError(f"unknown JetSpecDrafterConfig field(s): {sorted(unknown)}")
        values.update(overrides)
        drafter = cls(JetSpecDrafterConfig(**values))
        drafter.to(device=target.device)
        if init_layers_from_target:
            drafter.init_layers_from_target(target)
        drafter.attach_target(target, follow_dtype=False)
        return drafter

    @torch.no_grad()
    def init_layers_from_target(self, target) -> None:
        """Copy the target's top ``num_hidden_layers`` decoder layers into the drafter layers.

        A drafter with a narrower MLP than the target keeps the target's most important neurons
        (:func:`mlp_neuron_ranking`), so a small drafter still starts from the target's own weights."""
        src = target_decoder_layers(target)
        top = list(src)[-len(self.layers) :]
        for mine, theirs in zip(self.layers, top):
            state = {k: v for k, v in theirs.state_dict().items()}
            own = mine.state_dict()
            width = own["mlp.down_proj.weight"].shape[1]
            if "mlp.down_proj.weight" in state and state["mlp.down_proj.weight"].shape[1] > width:
                keep = mlp_neuron_ranking(
                    state["mlp.gate_proj.weight"], state["mlp.up_proj.weight"], state["mlp.down_proj.weight"]
                )[:width].sort().values
                for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
                    state[name] = state[name].index_select(0, keep)
                state["mlp.down_proj.weight"] = state["mlp.down_proj.weight"].index_select(1, keep)
            missing = [k for k in own if k not in state or state[k].shape != own[k].shape]
            # per-head q/k norms the target lacks keep their identity-scale initialisation
            missing = [k for k in missing if not (k.startswith(("self_attn.q_norm.", "self_attn.k_norm.")) and k not in state)]
            if missing:
                raise ValueError(
                    f"cannot initialise drafter layers from {type(theirs).__name__}: parameters {missing} "
                    "have no counterpart of the same shape"
                )
            mine.load_state_dict({k: state[k].to(self.dtype) if k in state else v for k, v in own.items()})

    @torch.no_grad()
    def grow_layers(self, num_new: int, target=None) -> None:
        """Append ``num_new`` decoder layers on top without changing what the drafter computes.

        The new layers' residual outputs (``o_proj`` and ``down_proj``) start at zero, so the grown
        drafter drafts exactly as before and training decides what the extra depth adds. With
        ``target``, their other weights start from the target's top layers (as
        :meth:`init_layers_from_target`); otherwise from the usual random initialisation.
        """
        if num_new < 1:
            raise ValueError(f"grow_layers needs at least one new layer, got {num_new}")
        if target is None:
            new = nn.ModuleList(DecoderLayer.from_config(self.config) for _ in range(num_new))
            new.apply(self._init_weights)
        else:  # a drafter of just the new layers, initialised from the target, lends them
            scratch = type(self)(self.config.__class__(**{**self.config.to_dict(), "num_hidden_layers": num_new}))
            scratch.to(dtype=self.dtype)
            scratch.init_layers_from_target(target)
            new = scratch.layers
        new.to(device=self.layers[0].self_attn.q_proj.weight.device, dtype=self.layers[0].self_attn.q_proj.weight.dtype)
        for layer in new:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        self.layers.extend(new)
        self.config.num_hidden_layers = len(self.layers)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, drafting_config: DraftingConfig | None = None, **kwargs):
        """Load a drafter (safetensors only). Drafting options may be given as ``drafting_config``
        or as keyword arguments named like its fields (``num_jacobi_passes=2, budget=32``).

        A DFlash release checkpoint or a transformers ``MuseGlimmerAssistantModel`` folder is recognised
        by its ``config.json`` and converted on load (:mod:`hf_jetspec.drafter.dflash_format`); ``target=`` then
        fills in the target fields those formats do not record (otherwise the drafter adopts the
        first target it is attached to), and ``dtype=`` picks the weights' dtype (default: as stored)."""
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in DraftingConfig.field_names()}
        target = kwargs.pop("target", None)
        stored = _stored_config(pretrained_model_name_or_path, kwargs)
        if stored and checkpoint_format(stored) != "jetspec":
            kwargs["target"] = target
            model = _from_foreign(cls, pretrained_model_name_or_path, stored, kwargs)
            model.drafting_config = (drafting_config or DraftingConfig()).replace(**options)
            model.pretrained_source = (str(pretrained_model_name_or_path), hub_options(kwargs))
            return model
        if stored.get("weight_storage") in WEIGHT_STORAGES:
            model = _from_compact(cls, pretrained_model_name_or_path, stored, kwargs)
        else:
            kwargs["use_safetensors"] = True
            try:
                model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            except Exception as err:  # make corrupt / truncated weight files say so
                if type(err).__name__ in {"SafetensorError", "HeaderTooLarge", "MetadataIncompleteBuffer"} or "deserializ" in str(err):
                    raise OSError(
                        f"the drafter weights in {pretrained_model_name_or_path!r} could not be read ({err}); "
                        "the safetensors file is corrupt or truncated: re-download or re-save it"
                    ) from err
                raise
        if drafting_config is None:
            drafting_config = _load_drafting_config(pretrained_model_name_or_path, kwargs)
        model.drafting_config = drafting_config.replace(**options)
        model.pretrained_source = (str(pretrained_model_name_or_path), hub_options(kwargs))
        if target is not None:
            model.attach_target(target)
        return model

    def save_pretrained(self, save_directory, *args, weight_storage: str | None = None, **kwargs):
        """Save the weights, configuration and drafting options as a Hub-ready folder (the round
        policy's calibrations travel with :meth:`JetSpecAssistant.save_pretrained
        <hf_jetspec.assistant.JetSpecAssistant.save_pretrained>`). ``weight_storage="int8"`` stores the large matrices as int8 with
        per-channel scales (:mod:`hf_jetspec.drafter.weight_storage`, about half the size of float16),
        ``"int4"`` as int4 with a scale per group of 64 columns (about a quarter);
        ``from_pretrained`` dequantises them."""
        if weight_storage is not None and weight_storage not in WEIGHT_STORAGES:
            raise ValueError(f"weight_storage must be None or one of {WEIGHT_STORAGES}, got {weight_storage!r}")
        kwargs.pop("safe_serialization", None)
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            if weight_storage is not None:
                _store_compact(save_directory, weight_storage)
            self.drafting_config.save(save_directory)

    def restrict_draft_vocab(self, token_ids) -> None:
        """Draft only among ``token_ids`` (e.g. the most frequent tokens of the target's outputs).

        Restricts the LM head rows the drafter scores, which dominates its cost on CPU. Any trained
        drafter can be restricted after training; drafts outside the set are simply never proposed
        (verification keeps the output exact either way).
        """
        if self.config.target_vocab_size is None:
            raise ValueError("this converted drafter does not know its target's vocabulary yet: attach_target(target) first")
        ids = torch.as_tensor(list(token_ids), dtype=torch.long).unique()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.config.target_vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in 0..{self.config.target_vocab_size - 1}")
        self.config.draft_vocab_size = int(ids.numel())
        if "draft_vocab" in self._buffers:
            del self._buffers["draft_vocab"]
        self.register_buffer("draft_vocab", ids.to(self.device), persistent=True)
        if self.__dict__["_target"] is not None:
            self.attach_target(self.__dict__["_target"])

    def widen_draft_vocab(self, ranked_ids, size: int) -> None:
        """Add the first ids of ``ranked_ids`` (e.g. the target's answer tokens, most frequent first)
        to a restricted draft vocabulary until it holds ``size`` ids. Every id it held stays draftable,
        and the head rows come from the target's head, so the new tokens are scored as the trained
        drafter's final states rate them (:func:`hf_jetspec.drafter.draft_vocab.widened_vocab`)."""
        from .draft_vocab import widened_vocab

        if self.config.draft_vocab_size is None:
            raise ValueError("this drafter drafts over the target's whole vocabulary already")
        self.restrict_draft_vocab(widened_vocab(self.draft_vocab.tolist(), ranked_ids, size))

    @property
    def draft_vocab_ids(self) -> torch.Tensor | None:
        """The target id of each row of the draft head; None when the draft vocabulary is the target's."""
        return self.draft_vocab if self.config.draft_vocab_size is not None else None

    def draft_index(self) -> torch.Tensor | None:
        """Map target id -> row of the restricted draft head (-1: not draftable), on CPU; None if unrestricted."""
        if self.config.draft_vocab_size is None:
            return None
        index = torch.full((self.config.target_vocab_size,), -1, dtype=torch.long)
        index[self.draft_vocab.cpu()] = torch.arange(self.config.draft_vocab_size)
        return index

    # ------------------------------------------------------------------ the target it serves
    def check_target(self, target) -> None:
        """Raise a ``ValueError`` naming both sides if ``target`` is not the one this drafter serves.

        A drafter converted from a format that does not record its target (``target_*`` fields None)
        first adopts ``target``'s signature."""
        filled = self.config.adopt_target_fields(target_signature(target))
        if filled:
            logger.info(f"JetSpecDrafter: {', '.join(filled)} taken from the target {getattr(target, 'name_or_path', '')!r}")
        check_target_matches(self.config, target, "JetSpecDrafter", "JetSpecDrafter.for_target(target)", "drafter")

    def attach_target(self, target, follow_dtype: bool = True) -> None:
        """Validate and reference ``target``'s embeddings and LM head (nothing is copied).

        The drafter follows the target to its device and, unless ``follow_dtype=False`` (training
        keeps fp32 master weights beside a bf16 target), to its floating dtype."""
        self.check_target(target)
        if self.device != target.device or (follow_dtype and self.dtype != target.dtype):
            self.to(device=target.device, dtype=target.dtype if follow_dtype else self.dtype)
        self.__dict__["_target"] = target
        weight = target.get_output_embeddings().weight
        vocab = self.draft_vocab_ids
        # the same head tensor while neither the target's head nor the draft vocabulary changed (a new
        # tensor per generate call would cost a copy and, under the compiled int8 step, a new graph).
        # A row subset is taken outside autograd: the target is frozen wherever a drafter trains, and a
        # held subset with a graph would carry one training step's graph into the next.
        versions = (weight._version, None if vocab is None else vocab._version)  # in-place changes count too
        held = self.__dict__.get("_head_source")
        if held is None or held[0] is not weight or held[1] is not vocab or held[2] != versions:
            if vocab is None:
                head = weight
            else:
                with torch.no_grad():
                    head = weight.index_select(0, vocab.to(weight.device))
            self.__dict__["_head_weight"] = head
            self.__dict__["_head_source"] = (weight, vocab, versions)
        if self.int8_drafting:
            self.__dict__["_int8_head"].refresh(self.__dict__["_head_weight"])

    @property
    def target(self):
        if self.__dict__["_target"] is None:
            raise RuntimeError(
                "this drafter has no target attached: pass it as assistant_model= to target.generate(...), "
                "or call drafter.attach_target(target)"
            )
        return self.__dict__["_target"]

    # ------------------------------------------------------------------ building blocks
    def project_context(self, target_states: torch.Tensor) -> torch.Tensor:
        """Concatenated read-layer states [B, T, n_read * H_target] -> drafter context [B, T, H]."""
        return self.context_norm(self.fc(target_states.to(self.dtype)))

    def embed_block(self, block_input_ids: torch.Tensor, noise_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings of block inputs (the target's table); ``noise_mask`` marks mask inputs
        (the target's embedding of ``config.mask_token_id``, or the learned mask embedding)."""
        emb = self.target.get_input_embeddings()
        mask_id = self.config.mask_token_id
        if noise_mask is not None and mask_id is not None:
            block_input_ids = torch.where(noise_mask.to(block_input_ids.device), mask_id, block_input_ids)
        x = emb(block_input_ids.to(emb.weight.device)).to(device=self.device, dtype=self.dtype)
        if noise_mask is not None and mask_id is None and self.config.block_inputs == "mask":
            x = torch.where(noise_mask.to(x.device)[..., None], self.mask_embedding.to(x.dtype), x)
        return x

    def _rotary(self, positions: torch.Tensor):
        return self._rotary_table(positions, self.dtype, self.device)

    def _head(self) -> torch.Tensor:
        """The draft head: the target's LM head rows of the draft vocabulary [V_draft, H]."""
        head = self.__dict__["_head_weight"]
        return self.target.get_output_embeddings().weight if head is None else head

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (the target's LM head rows) for drafter outputs."""
        int8_head = self.__dict__.get("_int8_head")
        if int8_head is not None:
            return int8_linear(self.norm(hidden), *int8_head.packed)
        head = self._head()
        return F.linear(self.norm(hidden).to(head.dtype), head)

    def _to_target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary row indices -> target token ids."""
        if self.config.draft_vocab_size is not None:
            return self.draft_vocab.to(rows.device)[rows]
        return rows

    def draft_ids(self, logits: torch.Tensor) -> torch.Tensor:
        # max(-1).indices: the first maximal index, as argmax, at a fraction of bf16 argmax's cost on CPU
        return self._to_target_ids(logits.max(-1).indices)

    # ------------------------------------------------------------------ inference path
    def new_cache(self) -> DrafterCache:
        """An empty key/value cache of the verified context for this drafter's layers."""
        return DrafterCache(self.config.num_hidden_layers)

    def compile_drafting(self, enabled: bool = True) -> None:
        """Draft single blocks through a ``torch.compile``d step with static shapes
        (:mod:`hf_jetspec.drafter.compiled_step`); each block length and cache capacity compiles once.
        ``enabled=False`` drafts eagerly again (the compiled graphs are kept for a later switch back)."""
        from .compiled_step import CompiledDraftStep

        if enabled and self.__dict__.get("_compiled_step") is None:
            self.__dict__["_compiled_step"] = CompiledDraftStep()
        self.__dict__["_compile_on"] = bool(enabled)

    def set_int8_drafting(self, enabled: bool = True) -> None:
        """Multiply the decoder layers' matrices and the draft head in int8 while drafting (CPU only;
        :mod:`hf_jetspec.drafter.int8_drafting`). The weights are quantised once, at the first switch on, from
        their values then; parameters and state dict stay floating point. ``enabled=False`` restores
        floating-point drafting (switch off and on again to re-quantise after changing the weights).
        ``generate`` sets it from ``drafting_config.int8`` at every call."""
        linears = [m for layer in self.layers for m in layer.modules() if isinstance(m, nn.Linear)]
        if enabled:
            check_int8_device(self.device)
            for linear in linears:
                if not is_quantized(linear):
                    quantize_linear(linear)
            if self.__dict__.get("_int8_head") is None:
                self.__dict__["_int8_head"] = Int8Head()
            if self.__dict__["_head_weight"] is not None:  # else at attach_target
                self.__dict__["_int8_head"].refresh(self.__dict__["_head_weight"])
        else:
            for linear in linears:
                restore_linear(linear)
            self.__dict__["_int8_head"] = None

    def configure_engine(self, options: DraftingConfig) -> None:
        """Switch the compiled step and int8 arithmetic per ``options`` (``compile`` / ``int8``); every
        ``generate`` call does this first."""
        self.compile_drafting(options.compile or options.compiled_rounds)
        self.set_int8_drafting(options.int8)

    @property
    def int8_drafting(self) -> bool:
        """Whether drafting multiplies in int8 (:meth:`set_int8_drafting`)."""
        return self.__dict__.get("_int8_head") is not None

    @torch.no_grad()
    def append_context(self, cache: DrafterCache, target_states: torch.Tensor | list[torch.Tensor], positions: torch.Tensor,
                       window: int | None = None) -> None:
        """Add verified positions to the drafter cache: their read-layer states [1, T, n*H], or the list
        of per-layer states [1, T, H] (concatenated here). With a ``window``, only the newest
        ``window`` of them are projected, and the cache keeps its newest ``window`` rows."""
        if window is not None:
            positions = positions[-window:]
            target_states = [s[:, -window:] for s in target_states] if isinstance(target_states, list) else target_states[:, -window:]
        if isinstance(target_states, list):
            target_states = torch.cat(target_states, dim=-1)
        ctx = self.project_context(target_states.to(self.device))
        cos, sin = self._rotary(positions[None])
        if window is not None and len(cache) + positions.numel() > window:
            cache.keep_last(max(window - positions.numel(), 0))
        for i, layer in enumerate(self.layers):
            k, v = layer.context_kv(ctx, cos, sin)
            cache.append(i, k, v)

    def new_row_contexts(self, rows: int, window: int | None = None) -> RowContexts:
        """Empty verified contexts of ``rows`` sequences drafted together (:meth:`draft_rows`)."""
        if self.config.sliding_window is not None:
            raise ValueError("a sliding-window drafter drafts one sequence at a time: batched generate needs a "
                             "drafter with full attention (sliding_window=None)")
        return RowContexts(self.config.num_hidden_layers, rows, window)

    @torch.no_grad()
    def append_row_contexts(self, contexts: RowContexts, states: list[list[torch.Tensor] | None],
                            positions: list[torch.Tensor | None]) -> None:
        """Add verified positions to each row of ``contexts``: ``states[b]`` is row ``b``'s list of
        read-layer states ``[1, T_b, H]`` at ``positions[b]`` ``[T_b]`` (None: nothing new). All rows
        are projected in one pass; with the contexts' window, only each row's newest ``window`` are."""
        window = contexts.window
        parts, places, counts = [], [], []
        for row_states, row_positions in zip(states, positions):
            if row_states is None or row_positions is None or row_positions.numel() == 0:
                counts.append(0)
                continue
            if window is not None:
                row_positions = row_positions[-window:]
                row_states = [s[:, -window:] for s in row_states]
            parts.append(torch.cat(row_states, dim=-1))
            places.append(row_positions)
            counts.append(int(row_positions.numel()))
        if not parts:
            return
        ctx = self.project_context(torch.cat(parts, dim=1).to(self.device))
        cos, sin = self._rotary(torch.cat(places)[None])
        contexts.write([layer.context_kv(ctx, cos, sin) for layer in self.layers], counts)

    @torch.no_grad()
    def draft_rows(self, contexts: RowContexts, block_input_ids: torch.Tensor, start_positions: torch.Tensor,
                   noise_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward over a block per row, ``[B, gamma]`` starting at ``start_positions`` ``[B]``, each
        against its own row's context. Returns the argmax draft ids ``[B, gamma]`` (target ids) and
        their top-1 probabilities ``[B, gamma]`` (float32)."""
        bsz, gamma = block_input_ids.shape
        layers, visible = contexts.view()
        summary = self.draft_blocks(self.new_cache(), block_input_ids, start_positions, noise_mask, extra=(layers, visible),
                                    summary=True)
        ids = self._to_target_ids(summary.ids).reshape(bsz, gamma)
        return ids, summary.top1_prob.reshape(bsz, gamma)

    @torch.no_grad()
    def draft_rows_topk(self, contexts: RowContexts, block_input_ids: torch.Tensor, start_positions: torch.Tensor, k: int,
                        noise_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`draft_rows` with each position's top-``k`` candidates: the argmax ids ``[B, gamma]``
        and the top-``k`` target ids and probabilities ``[B, gamma, k]`` (float32)."""
        layers, visible = contexts.view()
        ids, logits = self.draft_blocks(self.new_cache(), block_input_ids, start_positions, noise_mask, extra=(layers, visible))
        probs, rows = torch.softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
        return ids, self._to_target_ids(rows), probs

    @torch.no_grad()
    def extra_context(self, target_states: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer keys/values of rows that are not in the cache (e.g. foresight-predicted states [1, E, n*H])."""
        ctx = self.project_context(target_states.to(self.device))
        cos, sin = self._rotary(positions[None])
        return [layer.context_kv(ctx, cos, sin) for layer in self.layers]

    @torch.no_grad()
    def draft_block(
        self,
        cache: DrafterCache,
        block_input_ids: torch.Tensor,
        start_position: int,
        noise_mask: torch.Tensor | None = None,
        return_logits: bool = False,
    ):
        """One forward over a block [gamma] of inputs against the cached context.

        Returns the argmax draft ids [gamma] (and the draft-vocabulary logits [gamma, V_draft] with
        ``return_logits``)."""
        gamma = block_input_ids.shape[-1]
        ids, logits = self.draft_blocks(
            cache,
            block_input_ids.reshape(1, gamma),
            torch.tensor([start_position]),
            None if noise_mask is None else noise_mask.reshape(1, gamma),
        )
        return (ids[0], logits[0]) if return_logits else ids[0]

    @torch.no_grad()
    def draft_block_summary(self, cache: DrafterCache, block_input_ids: torch.Tensor, start_position: int, noise_mask: torch.Tensor | None = None):
        """:meth:`draft_block` for the round policy: the argmax draft ids [gamma] (target ids) and the
        :class:`~hf_jetspec.kernels.HeadSummary` of each row (top-1 probability without a softmax copy;
        on CUDA through the fused head kernel where it measured faster)."""
        gamma = block_input_ids.shape[-1]
        summary = self.draft_blocks(cache, block_input_ids.reshape(1, gamma), torch.tensor([start_position]),
                                    None if noise_mask is None else noise_mask.reshape(1, gamma), summary=True)
        return self._to_target_ids(summary.ids), summary

    @torch.no_grad()
    def draft_blocks(self, cache: DrafterCache, block_input_ids: torch.Tensor, start_positions: torch.Tensor, noise_mask=None, extra=None,
                     summary: bool = False):
        """Draft a batch of blocks [B, gamma] starting at ``start_positions`` [B] against the cached context.

        ``extra = (per-layer keys/values of E rows, visibility [B, E])`` adds context rows that only
        some blocks see (foresight: predicted states of the block under verification up to each
        outcome's k). Returns ``(ids [B, gamma], logits [B, gamma, V_draft])``, or with ``summary``
        the rows' :class:`~hf_jetspec.kernels.HeadSummary` (flattened over B * gamma, draft-vocabulary
        indices) instead.
        """
        bsz, gamma = block_input_ids.shape
        device = self.device
        skip = 0
        if self.config.row_predicts == "self":  # one more mask row; outputs from row 1 on
            block_input_ids, noise_mask = with_trailing_mask_row(block_input_ids, noise_mask)
            gamma, skip = gamma + 1, 1
        x = self.embed_block(block_input_ids, noise_mask)
        positions = start_positions.cpu()[:, None] + torch.arange(gamma)  # on the CPU: the table reads its range for free
        cos, sin = self._rotary(positions)
        causal = self.config.attention == "causal"
        step = self.__dict__.get("_compiled_step") if self.__dict__.get("_compile_on") else None
        length = gamma if step is None else step.length_for(gamma, causal)
        if step is not None and extra is None and bsz == 1 and step.usable(cache, length):
            if length > gamma:  # padded at the end to a compiled length (causal: no real row sees the padding)
                x = F.pad(x, (0, 0, 0, length - gamma))
                cos, sin = self._rotary(start_positions.cpu()[:, None] + torch.arange(length))
            logits = step(self, cache, x, cos, sin, causal)[:, skip:gamma]
            if summary:
                return summarise_logits(logits)
            return self.draft_ids(logits), logits
        attend = BlockAttention(cache, bsz, gamma, extra, causal, device, self.config.sliding_window, positions)
        for li, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attend.mask, partial(attend.keys, li))
        x, gamma = x[:, skip:], gamma - skip
        if summary:
            if self.int8_drafting:
                return summarise_logits(self.draft_logits(x).reshape(bsz * gamma, -1))
            return head_summary(self.norm(x).reshape(bsz * gamma, -1), self._head())
        logits = self.draft_logits(x)
        return self.draft_ids(logits), logits

    # ------------------------------------------------------------------ training path
    def forward(
        self,
        context_states: torch.Tensor,
        block_input_ids: torch.Tensor,
        anchor_positions: torch.Tensor,
        noise_mask: torch.Tensor | None = None,
        context_positions: torch.Tensor | None = None,
        context_visible: torch.Tensor | None = None,
        return_hidden_states: bool = False,
        draft_lengths: torch.Tensor | None = None,
    ) -> JetSpecDrafterOutput:
        """Draft many blocks of one sequence batch in one pass (the training view).

        Args:
            context_states: [B, C, n_read * H_target] target states at the read layers.
            block_input_ids: [B, nb, gamma] block inputs; index 0 of each block is its anchor.
            anchor_positions: [B, nb] sequence position of each anchor; block ``b`` sees the context
                positions before its anchor.
            noise_mask: [B, nb, gamma] positions that hold noise (replaced by the mask embedding
                for ``block_inputs="mask"`` drafters).
            context_positions: [B, C] sequence positions of the context rows (default: row j is
                position j).
            context_visible: [B, nb, C] which context rows each block sees (default: the rows at
                positions before its anchor). Lets blocks read extra rows, e.g. the states of a
                target rollout for in-rollout anchors.
            draft_lengths: [B, nb] how many tokens each block drafts (default all ``gamma``): a block
                drafting ``k`` has only the rows that drafting ``k`` tokens at inference has (the
                anchor and ``k`` mask rows for ``row_predicts="self"``), so a bidirectional drafter
                learns the blocks a server such as vLLM gives it at ``num_speculative_tokens = k``.
                Its outputs from slot ``k`` on are not meaningful (give them no loss).
        Returns:
            :class:`JetSpecDrafterOutput` with logits [B, nb, gamma, V_draft]; output i of a block
            predicts the token at block index i + 1.
        """
        skip = 0
        if self.config.row_predicts == "self":  # one more mask row per block; outputs from row 1 on
            block_input_ids, noise_mask = with_trailing_mask_row(block_input_ids, noise_mask)
            skip = 1
        bsz, nb, gamma = block_input_ids.shape
        t = context_states.shape[1]
        ctx = self.project_context(context_states)
        if context_positions is None:
            context_positions = torch.arange(t, device=self.device)[None].expand(bsz, t)
        if context_visible is None:
            context_visible = context_visibility(anchor_positions.to(self.device), t)
        ctx_cos, ctx_sin = self._rotary(context_positions.to(self.device))
        x = self.embed_block(block_input_ids.reshape(bsz, nb * gamma), None if noise_mask is None else noise_mask.reshape(bsz, nb * gamma))
        positions = (anchor_positions[:, :, None] + torch.arange(gamma, device=anchor_positions.device)).reshape(bsz, nb * gamma)
        cos, sin = self._rotary(positions.to(self.device))
        rows = None if draft_lengths is None else (draft_lengths.to(self.device).clamp(min=1) + skip)
        mask = PackedBlocks(context_visible.to(self.device), gamma, self.config.attention == "causal", rows)
        if self.config.sliding_window is not None:
            keys = torch.cat([context_positions.to(self.device), positions.to(self.device)], dim=1)
            mask = mask.dense() & sliding_window_mask(positions.to(self.device), keys, self.config.sliding_window)
        for layer in self.layers:
            kv = layer.context_kv(ctx, ctx_cos, ctx_sin)
            x = layer(x, cos, sin, mask, kv)
        x = x.reshape(bsz, nb, gamma, -1)[:, :, skip:]
        logits = self.draft_logits(x)
        return JetSpecDrafterOutput(logits=logits, hidden_states=x if return_hidden_states else None)


def mlp_neuron_ranking(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """SwiGLU neurons ordered by importance, most important first.

    A neuron ``i`` reads rows ``gate[i]`` and ``up[i]`` and writes column ``down[:, i]``; its score
    is the product of the three norms, a bound on how much it can move the output for unit input."""
    score = gate.float().norm(dim=1) * up.float().norm(dim=1) * down.float().norm(dim=0)
    return torch.argsort(score, descending=True, stable=True)


def with_trailing_mask_row(block_input_ids: torch.Tensor, noise_mask: torch.Tensor | None):
    """Blocks [..., L] with one more row at the end that holds noise, and their noise mask [..., L + 1]
    (a ``row_predicts="self"`` drafter's extra row; its id is a placeholder the mask replaces)."""
    pad = torch.zeros_like(block_input_ids[..., :1])
    if noise_mask is None:
        noise_mask = torch.zeros(block_input_ids.shape, dtype=torch.bool, device=block_input_ids.device)
    noise_mask = noise_mask.to(block_input_ids.device)
    return torch.cat([block_input_ids, pad], dim=-1), torch.cat([noise_mask, torch.ones_like(pad, dtype=torch.bool)], dim=-1)


def _load_drafting_config(name_or_path, kwargs) -> DraftingConfig:
    path = companion_file(name_or_path, DRAFTING_CONFIG_NAME, kwargs)
    return DraftingConfig.load(os.path.dirname(path)) if path else DraftingConfig()


def _stored_config(name_or_path, kwargs) -> dict:
    """The folder's ``config.json`` as a dict ({} when absent): it tells our own format, int8 storage
    and DFlash / MuseGlimmerAssistant checkpoints (:func:`~hf_jetspec.drafter.dflash_format.checkpoint_format`) apart."""
    import json

    path = companion_file(name_or_path, "config.json", kwargs)
    if path is None:
        return {}
    with open(path) as f:
        return json.load(f)


def _store_compact(folder, storage: str = "int8") -> None:
    """Rewrite a saved folder's weights as int8 (or int4) matrices with their scales and mark its config."""
    import json

    from safetensors.torch import load_file, save_file

    from .weight_storage import pack_weights

    weights = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(weights):
        raise OSError(f"{storage} storage needs a single model.safetensors in {folder} (raise max_shard_size)")
    save_file(pack_weights(load_file(weights), storage=storage), weights, metadata={"format": "pt"})
    config_path = os.path.join(folder, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["weight_storage"] = storage
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def _from_compact(cls, name_or_path, stored: dict, kwargs) -> "JetSpecDrafter":
    """Build a drafter from an int8-stored folder (``stored``: its ``config.json``): dequantise to the
    stored (or requested) dtype."""
    from .weight_storage import unpack_weights

    config_dict = {k: v for k, v in stored.items() if k != "weight_storage"}
    config = cls.config_class.from_dict(config_dict)
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype in (None, "auto"):
        dtype = config_dict.get("dtype") or "float32"
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    state = unpack_weights(_foreign_state_dict(name_or_path, kwargs), dtype)
    model = cls(config)
    if "draft_vocab" in state and "draft_vocab" in model._buffers and state["draft_vocab"].shape != model.draft_vocab.shape:
        raise OSError(f"{name_or_path!r}: the stored draft vocabulary does not match config.draft_vocab_size")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise OSError(f"the {stored['weight_storage']} weights in {name_or_path!r} do not fit this drafter: missing {missing}, unexpected {unexpected}")
    model.to(dtype=dtype)
    if kwargs.get("device_map") not in (None, "auto"):
        model.to(kwargs["device_map"])
    return model.eval()


def _foreign_state_dict(name_or_path, kwargs) -> dict:
    """All tensors of a checkpoint stored as ``model.safetensors`` or as shards with an index."""
    import json

    from safetensors.torch import load_file

    single = companion_file(name_or_path, "model.safetensors", kwargs)
    if single is not None:
        files = [single]
    else:
        index = companion_file(name_or_path, "model.safetensors.index.json", kwargs)
        if index is None:
            raise OSError(f"{name_or_path!r} has no model.safetensors (or sharded index) to convert")
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        files = [companion_file(name_or_path, shard, kwargs) for shard in shards]
    state = {}
    for file in files:
        try:
            state.update(load_file(file))
        except Exception as err:
            raise OSError(f"the weights in {file!r} could not be read ({err}); the safetensors file is corrupt or truncated") from err
    return state


def _from_foreign(cls, name_or_path, config: dict, kwargs) -> "JetSpecDrafter":
    from .dflash_format import convert_to_jetspec

    target = kwargs.pop("target", None)
    fields = None if target is None else {k: v for k, v in target_signature(target).items() if k != "target_hidden_size"}
    state, drafter_config, fmt = convert_to_jetspec(_foreign_state_dict(name_or_path, kwargs), config, fields)
    logger.warning_once(f"JetSpecDrafter: converting the {fmt} checkpoint {str(name_or_path)!r} on load (hf_jetspec.drafter.dflash_format)")
    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype in (None, "auto"):
        dtype = next(v.dtype for v in state.values() if v.is_floating_point())
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = cls(drafter_config)
    model.load_state_dict(state, strict=True)
    model.to(dtype=dtype)
    if kwargs.get("device_map") not in (None, "auto"):
        model.to(kwargs["device_map"])
    if target is not None:
        model.attach_target(target, follow_dtype=False)
    return model.eval()
