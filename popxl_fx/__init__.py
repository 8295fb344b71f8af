"""popxl_fx: trace PyTorch models into PopXL programs and train them on the simulated IPU.

Ways in: `training_model` (forward, loss, autodiff and a torch optimizer as one program),
`compile` (forward and backward on the simulator inside an unchanged torch loop) and
`testing.assert_matches_eager`; `Options` picks the device. `data` holds the examples' data.
"""

from . import testing
from .api import Options, Trainer, compile, training_model
from .check import CheckReport, check
from .errors import Issue, UnsupportedError
from .explain import Explanation, explain
from .inference import InferenceModel, inference_model
from .lowering import LoweringContext, lowers
from .module import Module
from .optim_ipu import IPUAdam
from .phases import phase

__all__ = ["Options", "Trainer", "compile", "testing", "training_model"]
__all__ += [
    "CheckReport",
    "Explanation",
    "IPUAdam",
    "InferenceModel",
    "Issue",
    "LoweringContext",
    "Module",
    "UnsupportedError",
    "check",
    "explain",
    "inference_model",
    "lowers",
    "phase",
]
