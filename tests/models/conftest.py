"""Tiny models on one torch thread (faster than two on a shared 2-core machine)."""

from torchutil import one_torch_thread

__all__ = ["one_torch_thread"]
