"""popxl.ops: every op function. Each op is declared once in the op table (registry.py)."""

from . import (  # noqa: F401 (registers ops)
    attention_flash,
    collectives,
    nll_direct,
    pool_indices,
    var_updates,
)
from .activations import *  # noqa: F403
from .activations import __all__ as _activations_all
from .aten import *  # noqa: F403
from .aten import __all__ as _aten_all
from .attention import *  # noqa: F403
from .attention import __all__ as _attention_all
from .call import *  # noqa: F403
from .call import __all__ as _call_all
from .code_load import *  # noqa: F403
from .code_load import __all__ as _code_load_all
from .conditional import *  # noqa: F403
from .conditional import __all__ as _conditional_all
from .elementwise import *  # noqa: F403
from .elementwise import __all__ as _elementwise_all
from .fp8 import *  # noqa: F403
from .fp8 import __all__ as _fp8_all
from .fp8_conv_transpose import *  # noqa: F403
from .fp8_conv_transpose import __all__ as _fp8_conv_transpose_all
from .indexing import *  # noqa: F403
from .indexing import __all__ as _indexing_all
from .io import *  # noqa: F403
from .io import __all__ as _io_all
from .layer_norm import *  # noqa: F403
from .layer_norm import __all__ as _layer_norm_all
from .linear import *  # noqa: F403
from .linear import __all__ as _linear_all
from .logical import *  # noqa: F403
from .logical import __all__ as _logical_all
from .losses import *  # noqa: F403
from .losses import __all__ as _losses_all
from .matmul import *  # noqa: F403
from .matmul import __all__ as _matmul_all
from .nn import *  # noqa: F403
from .nn import __all__ as _nn_all
from .random import *  # noqa: F403
from .random import __all__ as _random_all
from .reduce import *  # noqa: F403
from .reduce import __all__ as _reduce_all
from .remote import *  # noqa: F403
from .remote import __all__ as _remote_all
from .runtime_check import *  # noqa: F403
from .runtime_check import __all__ as _runtime_check_all
from .scaled_add import *  # noqa: F403
from .scaled_add import __all__ as _scaled_add_all
from .shape import *  # noqa: F403
from .shape import __all__ as _shape_all
from .statistics import *  # noqa: F403
from .statistics import __all__ as _statistics_all
from .unary import *  # noqa: F403
from .unary import __all__ as _unary_all

__all__ = [
    "collectives",
    "var_updates",
    *_aten_all,
    *_attention_all,
    *_call_all,
    *_code_load_all,
    *_conditional_all,
    *_elementwise_all,
    *_fp8_all,
    *_fp8_conv_transpose_all,
    *_indexing_all,
    *_io_all,
    *_layer_norm_all,
    *_linear_all,
    *_logical_all,
    *_losses_all,
    *_matmul_all,
    *_nn_all,
    *_random_all,
    *_reduce_all,
    *_runtime_check_all,
    *_remote_all,
    *_shape_all,
    *_statistics_all,
    *_activations_all,
    *_scaled_add_all,
    *_unary_all,
]
