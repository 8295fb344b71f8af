"""`WeightsDict`: host data for variables, checked against each variable's shape and dtype.

It lives in `addons.utils` (popxl.addons' ``popxl_addons.utils.WeightsDict``); the layers
import it from here."""

from __future__ import annotations

from ..utils import WeightsDict, host_value

__all__ = ["WeightsDict", "host_value"]
