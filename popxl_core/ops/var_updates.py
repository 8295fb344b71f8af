"""Op family: var_updates (filled in by its owner)."""

__all__: list = []
