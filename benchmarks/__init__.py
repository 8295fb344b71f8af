"""Benchmarks of popxl-fx against eager PyTorch, side by side in one process."""

__all__: list[str] = []
