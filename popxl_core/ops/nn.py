"""Op family: nn. The ops live in conv.py, norm.py and pool.py; this module gathers them."""

from .adaptive_pool import adaptive_average_pool
from .batch_norm_train import batch_norm_training
from .conv import PadType, conv, conv_transpose
from .ctc_decoder import ctc_beam_search_decoder
from .norm import batch_norm_inference, group_norm, layer_norm
from .pool import average_pool, max_pool
from .resize import interpolate
from .roi_align import roi_align
from .upsample import upsample

__all__ = [
    "PadType",
    "adaptive_average_pool",
    "average_pool",
    "batch_norm_inference",
    "batch_norm_training",
    "conv",
    "conv_transpose",
    "ctc_beam_search_decoder",
    "group_norm",
    "interpolate",
    "layer_norm",
    "max_pool",
    "roi_align",
    "upsample",
]
