"""addons.ops: composite ops built from popxl ops (cross entropy, host IO helpers).

`replicated_all_reduce_TP` (tensor-parallel all-reduces) is simulated; the other custom C++
ops of popxl.addons (sharded cross entropy, rotary embeddings, ...) are not part of this
package: they need poplar codelets.
"""

from . import replicated_all_reduce_TP  # noqa: F401 - registers ReplicatedAllReduceTP
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
