"""Op family: nn (filled in by its owner)."""

__all__: list = []
