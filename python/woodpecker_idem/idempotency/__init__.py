"""Dedup state of idempotent writers: the window stage the write pipeline consults, its
snapshots and the window rebuild."""

from .stage import WindowStage

__all__ = ["WindowStage"]
