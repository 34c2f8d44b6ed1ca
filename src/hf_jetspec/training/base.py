"""Trainer base shared by the drafter and adapter trainers: a frozen target and logged step metrics."""

from __future__ import annotations

import time

import torch
from transformers import Trainer


class FrozenTargetTrainer(Trainer):
    """A ``Trainer`` whose model is an add-on of a frozen ``target`` run online in every step.

    Subclasses implement ``compute_loss`` and may call :meth:`_record` for metrics that are
    averaged over the logging interval and logged beside the loss. Every log row also carries
    ``cpu_hours``: the CPU time (all threads, this process and the stints it resumed) spent so
    far, the cost axis of learning curves compared at equal compute.
    """

    def __init__(self, model, args, target=None, **kwargs):
        if target is None:
            raise ValueError(f"{type(self).__name__} needs the frozen target model: {type(self).__name__}(model=..., target=target, ...)")
        super().__init__(model=model, args=args, **kwargs)
        target.eval()
        if target.device != args.device:  # the frozen target runs next to the trained model (GPU runs)
            target.to(args.device)
        for p in target.parameters():
            p.requires_grad_(False)
        self.target = target
        model.attach_target(target, follow_dtype=False)  # trained weights stay in their own dtype
        self.model_accepts_loss_kwargs = False
        self._noise = torch.Generator().manual_seed(args.noise_seed)
        self._metrics: dict[str, list[float]] = {}
        self._cpu_base: float | None = None

    def cpu_hours(self) -> float:
        """CPU-hours spent on this training run: earlier stints (read from the resumed state) plus this process."""
        if self._cpu_base is None:
            earlier = [row["cpu_hours"] for row in self.state.log_history if "cpu_hours" in row]
            self._cpu_base = earlier[-1] if earlier else 0.0
        return self._cpu_base + time.process_time() / 3600.0

    def _record(self, name: str, value: float) -> None:
        self._metrics.setdefault(name, []).append(value)

    def log(self, logs: dict, *args, **kwargs) -> None:
        for name, values in self._metrics.items():
            if values:
                logs[name] = sum(values) / len(values)
        self._metrics = {}
        logs["cpu_hours"] = round(self.cpu_hours(), 5)
        super().log(logs, *args, **kwargs)
