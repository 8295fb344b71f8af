"""Op family: losses (filled in by its owner)."""

__all__: list = []
