"""popxl.transforms: functions from graph to graph."""

from .autodiff import ExpectedConnection, ExpectedConnectionType, GradGraphInfo, autodiff

__all__ = ["autodiff", "GradGraphInfo", "ExpectedConnection", "ExpectedConnectionType"]
