"""``JetSpecAssistant``: a drafter with its companions.

The drafter model (:class:`~hf_jetspec.JetSpecDrafter`) is weights, configuration, a forward and a
drafting step. What a ``generate`` call needs beside them lives here, one floor up:

- the round policy's acceptance calibrations (greedy and sampled), loaded from the drafter's folder;
- the output memory (earlier outputs and the running acceptance of n-gram proposals);
- a foresight adapter and its calibration, when attached;
- a small language model proposing chains beside the drafter, when attached (:mod:`.lm_source`).

``target.generate(..., assistant_model=drafter)`` composes the assistant of ``drafter`` on first use
(:func:`assistant_for`) and keeps it for the drafter's lifetime, so a drafter loaded with
``JetSpecDrafter.from_pretrained(folder)`` drafts with its folder's calibration and remembers its
outputs across calls, as a user expects. Build one explicitly to choose the companions
(``JetSpecAssistant(drafter, output_memory=...)``), or load and save a whole folder with
:meth:`JetSpecAssistant.from_pretrained` / :meth:`JetSpecAssistant.save_pretrained`.
"""

from __future__ import annotations

import os
import threading

from ..drafter.hub_files import companion_file
from ..drafter.modeling_drafter import JetSpecDrafter
from ..foresight import ForesightCalibration, load_foresight
from .lm_source import LMSource, LMSourceConfig
from ..policy import AcceptanceModel, OutputMemory
from ..policy.acceptance import ACCEPTANCE_CALIBRATION_NAME, SAMPLED_ACCEPTANCE_CALIBRATION_NAME

_SLOT = "_jetspec_assistant"  # where a drafter's composed assistant is kept: set from here, never read by the model
_LOCK = threading.Lock()


class JetSpecAssistant:
    """A :class:`~hf_jetspec.JetSpecDrafter` and its companions.

    Args:
        drafter: the drafter model.
        acceptance_model: the round policy's :class:`~hf_jetspec.policy.AcceptanceModel` for greedy
            rounds (default: raw probabilities, uncalibrated).
        sampled_acceptance_model: the fit on sampled rounds (drafts drawn from q), or None: sampled
            rounds then use ``acceptance_model``.
        output_memory: the :class:`~hf_jetspec.policy.OutputMemory` shared by this assistant's calls
            (default: a new, empty one).
    """

    def __init__(self, drafter: JetSpecDrafter, acceptance_model: AcceptanceModel | None = None,
                 sampled_acceptance_model: AcceptanceModel | None = None, output_memory: OutputMemory | None = None):
        if not isinstance(drafter, JetSpecDrafter):
            raise TypeError(f"JetSpecAssistant composes a JetSpecDrafter, got {type(drafter).__name__}")
        self.drafter = drafter
        self.acceptance_model = acceptance_model if acceptance_model is not None else AcceptanceModel()
        self.sampled_acceptance_model = sampled_acceptance_model
        self.output_memory = output_memory if output_memory is not None else OutputMemory()
        self.foresight = None  # (adapter, calibration) from attach_foresight
        self.online_learner = None  # an OnlineLearner from learn_online
        self.lm_source = None  # an LMSource from attach_lm_source

    def attach_lm_source(self, lm_source, config: LMSourceConfig | None = None) -> LMSource | None:
        """Propose chains from a small causal LM beside the drafter and the n-grams (:mod:`hf_jetspec.assistant.lm_source`).

        ``lm_source``: an :class:`~hf_jetspec.assistant.LMSource`, or a causal LM with the target's
        tokenizer (wrapped with ``config``; its restricted head keeps the drafter's draft vocabulary
        first), or None to detach. ``generate`` checks it against the target on every call."""
        if lm_source is not None and not isinstance(lm_source, LMSource):
            lm_source = LMSource(lm_source, config, preferred_ids=self.drafter.draft_vocab_ids)
        self.lm_source = lm_source
        return lm_source

    # ------------------------------------------------------------------ online learning
    def learn_online(self, config=None, target=None, buffer=None):
        """Keep training the drafter, between ``generate`` calls, on what those calls verified
        (:mod:`hf_jetspec.training.online`); returns the :class:`~hf_jetspec.OnlineLearner`.

        ``config``: an :class:`~hf_jetspec.OnlineLearningConfig` (default budget: 4 steps per call);
        ``target``: the model served (default: the first call's); ``buffer``: a
        :class:`~hf_jetspec.ReplayBuffer` to start from (e.g. ``ReplayBuffer.load`` of a saved one).
        ``stop_learning()`` detaches it; the weights learned so far stay."""
        from ..training.online import OnlineLearner

        if self.online_learner is not None:
            raise RuntimeError("this assistant already learns online: call stop_learning() first to replace its learner")
        self.online_learner = OnlineLearner(self, config, target=target, buffer=buffer)
        return self.online_learner

    def stop_learning(self):
        """Detach the online learner (its last learned weights are applied first); returns it."""
        learner, self.online_learner = self.online_learner, None
        if learner is not None:
            learner.apply_now()
        return learner

    # ------------------------------------------------------------------ composition
    @classmethod
    def for_drafter(cls, drafter: JetSpecDrafter) -> "JetSpecAssistant":
        """The assistant composed for ``drafter``: created on first use with the calibrations saved
        beside the drafter's weights (if it was loaded with ``from_pretrained``), then the same
        object for every later call with this drafter."""
        with _LOCK:
            assistant = drafter.__dict__.get(_SLOT)
            if assistant is None:
                assistant = cls(drafter, **load_calibrations(drafter.pretrained_source))
                drafter.__dict__[_SLOT] = assistant
            return assistant

    @classmethod
    def from_pretrained(cls, name_or_path, lm_source=None, lm_source_config: LMSourceConfig | None = None, **kwargs) -> "JetSpecAssistant":
        """``JetSpecDrafter.from_pretrained(name_or_path, **kwargs)`` and the calibrations saved beside
        it; ``lm_source``: a small causal LM (or :class:`~hf_jetspec.assistant.LMSource`) to propose
        chains beside the drafter (:meth:`attach_lm_source`)."""
        assistant = cls.for_drafter(JetSpecDrafter.from_pretrained(name_or_path, **kwargs))
        if lm_source is not None:
            assistant.attach_lm_source(lm_source, lm_source_config)
        return assistant

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """The drafter's folder (``JetSpecDrafter.save_pretrained``, same arguments) with the fitted
        acceptance calibrations beside it."""
        self.drafter.save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            self.save_calibrations(save_directory)

    def save_calibrations(self, save_directory) -> None:
        """Write the fitted (calibrated) acceptance models into ``save_directory``."""
        if self.acceptance_model.calibrated:
            self.acceptance_model.save(save_directory)
        if self.sampled_acceptance_model is not None and self.sampled_acceptance_model.calibrated:
            self.sampled_acceptance_model.save(save_directory)

    # ------------------------------------------------------------------ what generate reads
    @property
    def drafting_config(self):
        return self.drafter.drafting_config

    @drafting_config.setter
    def drafting_config(self, options) -> None:
        self.drafter.drafting_config = options

    @property
    def generation_stats(self):
        """The statistics of the drafter's latest ``generate`` call."""
        return self.drafter.generation_stats

    @generation_stats.setter
    def generation_stats(self, stats) -> None:
        self.drafter.generation_stats = stats

    @property
    def config(self):
        """The drafter's configuration (``generate`` reads the assistant's vocabulary size from it)."""
        return self.drafter.config

    def acceptance_model_for(self, sampling: bool) -> AcceptanceModel:
        """What prices drafted positions: the sampled fit when sampling and one exists."""
        if sampling and self.sampled_acceptance_model is not None:
            return self.sampled_acceptance_model
        return self.acceptance_model

    def attach_foresight(self, adapter, calibration=None) -> None:
        """Use a foresight adapter for foresight drafting and context refresh
        (``drafting_config.foresight`` / ``num_context_refreshes``).

        ``adapter`` is a :class:`~hf_jetspec.foresight.ForesightAdapter` for the drafter's read
        layers, a training-free :class:`~hf_jetspec.foresight.LayerSkipAdapter`, the
        :class:`~hf_jetspec.foresight.LoadedForesight` returned by
        :func:`~hf_jetspec.foresight.load_foresight`, or a folder (loaded with it, in the drafter's
        dtype). ``calibration`` is a fitted :class:`~hf_jetspec.foresight.ForesightCalibration` or its
        file; by default the one loaded with the adapter."""
        drafter = self.drafter
        if isinstance(adapter, (str, os.PathLike)):
            adapter = load_foresight(adapter, dtype=drafter.dtype, device=drafter.device)
        if hasattr(adapter, "adapter") and hasattr(adapter, "calibration"):  # a LoadedForesight
            adapter, calibration = adapter.adapter, calibration if calibration is not None else adapter.calibration
        adapter.check_drafter(drafter)
        if isinstance(calibration, (str, os.PathLike)):
            calibration = ForesightCalibration.load(calibration)
        self.foresight = (adapter.eval(), calibration)


def assistant_for(model) -> JetSpecAssistant:
    """The :class:`JetSpecAssistant` of a drafter (composed on first use), or the assistant itself."""
    if isinstance(model, JetSpecAssistant):
        return model
    if isinstance(model, JetSpecDrafter):
        return JetSpecAssistant.for_drafter(model)
    raise TypeError(f"expected a JetSpecDrafter or a JetSpecAssistant, got {type(model).__name__}")


def load_calibrations(source) -> dict:
    """The acceptance calibrations saved beside a drafter's weights, as ``JetSpecAssistant`` keyword
    arguments; ``source`` is ``drafter.pretrained_source`` (None: a drafter built in this process)."""
    if source is None:
        return {}
    name_or_path, options = source
    greedy = companion_file(name_or_path, ACCEPTANCE_CALIBRATION_NAME, options)
    sampled = companion_file(name_or_path, SAMPLED_ACCEPTANCE_CALIBRATION_NAME, options)
    return {"acceptance_model": AcceptanceModel.load(greedy) if greedy else None,
            "sampled_acceptance_model": AcceptanceModel.load(sampled) if sampled else None}
