"""popxl_fx: the torch.fx frontend for popxl_core (grows here), plus data helpers for examples."""

__all__: list = []
