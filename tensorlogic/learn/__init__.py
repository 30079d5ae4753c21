"""Learning: the training loop (``train``) and its checkpoints."""

from __future__ import annotations

from .checkpoint import load_checkpoint, save_checkpoint
from .loop import History, train

__all__ = ["History", "load_checkpoint", "save_checkpoint", "train"]
