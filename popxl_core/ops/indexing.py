"""Op family: indexing (filled in by its owner)."""

__all__: list = []
