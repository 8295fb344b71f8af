"""Op family: shape (filled in by its owner)."""

__all__: list = []
