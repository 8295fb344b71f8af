"""`ctc_beam_search_decode`: PopART's CTC beam search decoder (PopTorch's
``poptorch.ctc_beam_search_decoder``), lowered to popxl_core's ``CtcBeamSearchDecoder`` op.

PopART takes and gives the lengths and labels as uint32; torch sees them as int32, as
PopTorch returns them. Eager (outside a program) runs the op's own kernel, so a capture's
example values are the op's results.
"""

from __future__ import annotations

import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.ctc_decoder import CTC_BEAM_SEARCH_DECODER

from ..lowering import lowers

__all__ = ["ctc_beam_search_decode"]


def ctc_beam_search_decode(
    log_probs: torch.Tensor, lengths: torch.Tensor, blank: int, beam_width: int, top_paths: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log-probabilities [N, top_paths], lengths [N, top_paths], labels [N, top_paths,
    T])`` of the most likely label sequences of ``log_probs`` [T, N, C]."""
    kernel = CTC_BEAM_SEARCH_DECODER.kernel
    assert kernel is not None  # the row's kernel (a table row without one is a control op)
    probs, sizes, labels = kernel(
        log_probs, lengths.long(), blank=blank, beam_width=beam_width, top_paths=top_paths
    )
    return probs, sizes.int(), labels.int()


@lowers(ctc_beam_search_decode)
def _lower(ctx, log_probs, lengths, blank: int, beam_width: int, top_paths: int):
    probs, sizes, labels = ops.ctc_beam_search_decoder(
        log_probs, ops.cast(lengths, popxl.uint32), blank, beam_width, top_paths
    )
    return probs, ops.cast(sizes, popxl.int32), ops.cast(labels, popxl.int32)
