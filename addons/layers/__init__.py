"""addons.layers: Modules for common layers, each with a `torch_mapping` that copies the
parameters of the equivalent torch module."""

from .conv import Conv2D
from .embedding import Embedding
from .group_norm import GroupNorm
from .layer_norm import LayerNorm
from .layer_norm_distributed import LayerNormDistributed
from .linear import Linear
from .linear_fp8 import LinearFP8
from .linear_gq import LinearGQ
from .weights_dict import WeightsDict

__all__ = [
    "Conv2D",
    "Embedding",
    "GroupNorm",
    "LayerNorm",
    "LayerNormDistributed",
    "Linear",
    "LinearFP8",
    "LinearGQ",
    "WeightsDict",
]
