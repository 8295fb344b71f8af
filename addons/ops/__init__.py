"""addons.ops: composite ops built from popxl ops (cross entropy, host IO helpers).

popxl.addons' custom C++ ops are ops of the table here (``ReplicatedAllReduceTP``,
``RotaryPosEmbed``, ``GradReduceSquareAdd``, ``GroupQuantizeDecompress``,
``Fp8FindBestScale``, ``CrossEntropySharded``, ``CrossEntropyShardedWR``,
``LayerNormDistributed``), each with its gradient.
"""

# modules of their own, imported by their paths as in popxl.addons (which does not re-export
# them here); imported so that their ops are in the table
from . import (  # noqa: F401
    cross_entropy_sharded_loss,
    cross_entropy_sharded_wr_loss,
    fp8_mse_scale,
    fp8_utils,
    grad_reduce_square_add,
    group_quantize_decompress,
    layer_norm_distributed,
    replicated_all_reduce_TP,
    rotary_pos_embed,
)
from .cross_entropy import cross_entropy, cross_entropy_with_grad
from .fp8_amax_scale import fp8_amax_scale
from .host import host_load, host_store

__all__ = [
    "cross_entropy",
    "cross_entropy_with_grad",
    "fp8_amax_scale",
    "host_load",
    "host_store",
]
