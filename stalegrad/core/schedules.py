"""Learning-rate schedules, as functions of the (fractional) epoch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    """Constant, or step decay: multiply by ``gamma`` at each milestone epoch.

    ``LRSchedule(0.1, milestones=(80, 120), gamma=0.1)`` is the CIFAR schedule
    of the ResNet papers: 0.1, then 0.01 from epoch 80, 0.001 from epoch 120.
    """
    base: float
    milestones: tuple[float, ...] = ()
    gamma: float = 0.1

    def __post_init__(self):
        if not self.base > 0:
            raise ValueError(f"--lr must be > 0, got {self.base!r}")
        if any(m <= 0 for m in self.milestones) or list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"--lr-milestones must be increasing positive epochs, got {list(self.milestones)}")
        if not self.gamma > 0:
            raise ValueError(f"--lr-gamma must be > 0, got {self.gamma!r}")

    def __call__(self, epoch: float) -> float:
        drops = sum(1 for m in self.milestones if epoch >= m)
        return self.base * self.gamma ** drops

    def describe(self) -> str:
        if not self.milestones:
            return f"constant {self.base:g}"
        return f"{self.base:g}, x{self.gamma:g} at epochs {', '.join(f'{m:g}' for m in self.milestones)}"
