"""Nll's label checks and eager's own nll kernels (``aten.nll_loss_forward``/``_backward``).

Labels are data: an out-of-range one is found when the op runs (`OpDataError`, naming the label
and its index), as PopART's Nll does. The check runs on every step of a training loop, so the
common case (every label a class) costs one ``aminmax`` kernel; only when that fails does the
full check (which knows the ignore_index) look for the culprit.
"""

from __future__ import annotations

import torch

from ..errors import OpDataError

__all__ = [
    "aten_nll_backward",
    "aten_nll_forward",
    "check_labels",
    "reduction_code",
    "valid_labels",
]

# eager's kernels for log-probabilities of shape (N, C): F.nll_loss and autograd call these,
# and their sums (and the mean's division) round as here
_ATEN_REDUCTION = {"none": 0, "mean": 1, "sum": 2}


def valid_labels(lab: torch.Tensor, ignore_index) -> torch.Tensor:
    """The mask of labels that count (not the ignore_index)."""
    return lab != ignore_index if ignore_index is not None else torch.ones_like(lab, dtype=bool)


def _in_range(lab: torch.Tensor, classes: int) -> bool:
    """Every label is a class (one kernel): then no label is out of range, whatever the
    ignore_index."""
    if lab.numel() == 0:
        return True
    lo, hi = torch.aminmax(lab)
    return int(lo) >= 0 and int(hi) < classes


def _assert_in_range(lab, valid, classes: int, ignore_index) -> None:
    """The check inside a torch.compile'd graph (no Python branch on data there): the run
    stops with torch's assertion error, which names the class count."""
    if valid is None:
        valid = valid_labels(lab, ignore_index)
    ok = ~(valid & ((lab < 0) | (lab >= classes))).any()
    torch._assert_async(ok, f"a label that counts is out of range for {classes} classes")


def check_labels(
    lab: torch.Tensor, valid: torch.Tensor | None, classes: int, ignore_index=None
) -> None:
    """Raise `OpDataError` for the first label that counts and is not a class (``valid``:
    `valid_labels`, computed from ``ignore_index`` when None and needed)."""
    if torch.compiler.is_compiling():  # Options(kernels="inductor"): a check in the graph
        _assert_in_range(lab, valid, classes, ignore_index)
        return
    if _in_range(lab, classes):
        return
    if valid is None:
        valid = valid_labels(lab, ignore_index)
    bad = valid & ((lab < 0) | (lab >= classes))
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise OpDataError(
            f"label {int(lab[where])} at index {where} is out of range for {classes} classes "
            f"[0, {classes}) (and is not the ignore_index)"
        )


def _aten_nll(probs, log_prob: bool) -> bool:
    return log_prob and probs.dim() == 2


def aten_nll_forward(logp, labels, reduction, ignore_index):
    """``((loss, total_weight), labels as int64, reduction code, ignore_index)``."""
    lab, red = labels.long(), _ATEN_REDUCTION[reduction]
    if ignore_index is not None and not torch.compiler.is_compiling():
        # aten checks every label that is not the ignore_index, as `check_labels` does (one
        # kernel fewer); where it fails, `check_labels` names the label
        ignore = int(ignore_index)
        try:
            return torch.ops.aten.nll_loss_forward(logp, lab, None, red, ignore), lab, red, ignore
        except IndexError:
            check_labels(lab, None, logp.shape[-1], ignore_index)
            raise
    check_labels(lab, None, logp.shape[-1], ignore_index)
    # no ignore_index: every label is in range (checked), so -1 never matches
    ignore = -1 if ignore_index is None else int(ignore_index)
    return torch.ops.aten.nll_loss_forward(logp, lab, None, red, ignore), lab, red, ignore


def reduction_code(reduction: str, ignore_index) -> tuple:
    """aten's reduction code and ignore_index (-1: none; every label is in range, checked,
    so -1 never matches)."""
    return _ATEN_REDUCTION[reduction], -1 if ignore_index is None else int(ignore_index)


def aten_nll_backward(logp, labels, g, reduction, ignore_index, replicas: int = 1):
    """Eager's gradient kernel. It wants the forward's total weight (the number of labels that
    count): when no label can be ignored that is the number of labels, exact in float below
    2**24, so the forward does not run again for it. ``replicas``: the rows are that many
    replicas' (sim/fold.py), each counting its own labels (``ValueError`` where the count
    needs the forward: it would count every replica's)."""
    lab, n = labels.long(), logp.shape[-1]
    ignorable = ignore_index is not None and 0 <= ignore_index < n  # a class is ignored
    # compiling: the forward (with its in-graph check) gives the total; the graph fuses it
    rerun = ignorable or lab.numel() >= 2**24 or torch.compiler.is_compiling()
    if replicas > 1 and rerun:
        raise ValueError("the replicas' label counts need each replica's forward")
    if rerun or not _in_range(lab, n):
        (_, total), lab, red, ignore = aten_nll_forward(logp, labels, reduction, ignore_index)
    else:
        total = torch.tensor(float(lab.numel() // replicas), dtype=logp.dtype)
        red, ignore = reduction_code(reduction, ignore_index)
    return torch.ops.aten.nll_loss_backward(g, logp, lab, None, red, ignore, total)
