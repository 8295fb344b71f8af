"""Op family: matmul (filled in by its owner)."""

__all__: list = []
