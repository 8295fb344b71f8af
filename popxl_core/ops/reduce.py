"""Op family: reduce (filled in by its owner)."""

__all__: list = []
