"""Op family: logical (filled in by its owner)."""

__all__: list = []
