"""Replica groupings: which replicas share a variable or take part in a collective."""

from __future__ import annotations

from typing import List, Optional

__all__ = ["ReplicaGrouping"]


class ReplicaGrouping:
    """A grouping of ``num_replicas`` replicas. Made by `Ir.replica_grouping`."""

    def __init__(self) -> None:
        raise TypeError("Use ir.replica_grouping(stride, group_size) to create a ReplicaGrouping.")

    @classmethod
    def _from_params(
        cls, num_replicas: int, stride: int = 1, group_size: Optional[int] = None
    ) -> "ReplicaGrouping":
        group_size = num_replicas // stride if group_size is None else group_size
        if stride < 1 or group_size < 1:
            raise ValueError(f"stride ({stride}) and group_size ({group_size}) must be >= 1.")
        if num_replicas % (stride * group_size) and not (stride == 1 and group_size == 1):
            raise ValueError(
                f"stride {stride} x group_size {group_size} does not divide "
                f"the replication factor {num_replicas}."
            )
        rg = object.__new__(cls)
        rg._num_replicas, rg._stride, rg._group_size = num_replicas, stride, group_size
        rg._assignment = None
        return rg

    @classmethod
    def _from_assignments(cls, assignment: List[int]) -> "ReplicaGrouping":
        rg = object.__new__(cls)
        rg._num_replicas = len(assignment)
        rg._assignment = list(assignment)
        counts = [assignment.count(g) for g in sorted(set(assignment))]
        rg._group_size = counts[0] if counts else 1
        rg._stride = _infer_stride(assignment)
        return rg

    @property
    def num_replicas(self) -> int:
        return self._num_replicas

    @property
    def stride(self) -> int:
        return self._stride

    @property
    def group_size(self) -> int:
        return self._group_size

    @property
    def num_groups(self) -> int:
        if self._assignment is not None:
            return len(set(self._assignment))
        return max(1, self._num_replicas // self._group_size)

    @property
    def is_const(self) -> bool:
        return self._assignment is None or _infer_stride(self._assignment) is not None

    @property
    def assignment(self) -> List[int]:
        """The group index of each replica."""
        if self._assignment is not None:
            return list(self._assignment)
        out, span = [], self._stride * self._group_size
        for r in range(self._num_replicas):
            block, offset = divmod(r, span)
            out.append(block * self._stride + offset % self._stride)
        return out

    def replicas_of_group(self, group: int) -> List[int]:
        return [r for r, g in enumerate(self.assignment) if g == group]

    def transpose(self) -> "ReplicaGrouping":
        """The orthogonal grouping: replicas that are in different groups here share one there."""
        a = self.assignment
        index_in_group = [a[:r].count(a[r]) for r in range(len(a))]
        return ReplicaGrouping._from_assignments(index_in_group)

    def __eq__(self, other) -> bool:
        return isinstance(other, ReplicaGrouping) and self.assignment == other.assignment

    def __hash__(self) -> int:
        return hash(tuple(self.assignment))

    def __repr__(self) -> str:
        if self._assignment is not None:
            return f"ReplicaGrouping(assignment={self._assignment})"
        return (
            f"ReplicaGrouping(num_replicas={self._num_replicas}, stride={self._stride}, "
            f"group_size={self._group_size}, num_groups={self.num_groups})"
        )


def _infer_stride(assignment: List[int]) -> Optional[int]:
    members = [i for i, g in enumerate(assignment) if g == assignment[0]] if assignment else []
    if len(members) < 2:
        return 1
    steps = {b - a for a, b in zip(members, members[1:])}
    return steps.pop() if len(steps) == 1 else None
