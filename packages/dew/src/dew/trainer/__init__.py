"""The Trainer, its state, checkpoints and metric trackers."""

from dew.trainer.signals import TrainingInterrupted
from dew.trainer.state import TrainState
from dew.trainer.trainer import NonFiniteLossError, Trainer

__all__ = ["NonFiniteLossError", "TrainState", "Trainer", "TrainingInterrupted"]
