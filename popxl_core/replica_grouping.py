"""Replica groupings: which replicas share a variable or take part in a collective."""

from __future__ import annotations

import math
from typing import List, Optional

__all__ = ["ReplicaGrouping", "VariableSettings"]


class ReplicaGrouping:
    """A grouping of ``num_replicas`` replicas. Made by `Ir.replica_grouping`."""

    # set by the `_from_*` factories (object.__new__, no __init__): declared for the type checker
    _num_replicas: int
    _stride: int
    _group_size: int
    _assignment: Optional[List[int]]

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
        # None where no stride describes the assignment: PopXL's `stride` is typed int and
        # callers read it only for strided groupings (`is_const` says which)
        rg._stride = _infer_stride(assignment)  # type: ignore[assignment]
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

    @property
    def const_rg(self) -> "ReplicaGrouping":
        """A grouping with a constant stride and group size whose every group lies inside one
        group of this one (this grouping itself when it is constant), with the fewest groups:
        PopXL's form of a grouping for the device (``[0, 0, 1, 1, 0, 0, 1, 1]`` gives
        ``[0, 0, 1, 1, 2, 2, 3, 3]``)."""
        if self._assignment is None:
            return self
        a = self._assignment
        runs = _const_runs(a)
        size = math.gcd(*(len(r) for r in runs))
        gaps = [b - x for r in runs for x, b in zip(r, r[1:])]
        stride = min(gaps) if size > 1 and gaps else 1
        return ReplicaGrouping._from_params(len(a), stride, size)

    @property
    def to_device_map(self) -> List[int]:
        """For each group of `const_rg`, the group of this grouping it lies in."""
        return _first_seen(self.const_rg.assignment, self.assignment)

    @property
    def to_host_map(self) -> List[int]:
        """For each group of this grouping, the first group of `const_rg` inside it."""
        return _first_seen(self.assignment, self.const_rg.assignment)

    def replicas_of_group(self, group: int) -> List[int]:
        return [r for r, g in enumerate(self.assignment) if g == group]

    def transpose(self) -> "ReplicaGrouping":
        """The orthogonal grouping: replicas that are in different groups here share one there."""
        a = self.assignment
        index_in_group = [a[:r].count(a[r]) for r in range(len(a))]
        return ReplicaGrouping._from_assignments(index_in_group)

    def _to_variable_settings(self, retrieval_mode: str = "one_per_group") -> "VariableSettings":
        """PopART's form of this grouping for a variable (PopXL's private method, which
        Graphcore's tests call to read the groups back)."""
        return VariableSettings(self, retrieval_mode)

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


class VariableSettings:
    """PopART's ``VariableSettings``: a variable's replica grouping and retrieval mode, as
    PopXL hands them to PopART. Only what Python code reads of it."""

    def __init__(self, grouping: ReplicaGrouping, retrieval_mode: str = "one_per_group"):
        if retrieval_mode not in ("one_per_group", "all_replicas"):
            raise ValueError(
                f"retrieval_mode must be 'one_per_group' or 'all_replicas', got {retrieval_mode!r}"
            )
        self._grouping, self._retrieval_mode = grouping, retrieval_mode

    def _for(self, replica_count: int) -> ReplicaGrouping:
        rg = self._grouping
        if replica_count == rg.num_replicas:
            return rg
        if not rg.is_const:
            raise ValueError(
                f"{rg} spans {rg.num_replicas} replicas; its groups over {replica_count} "
                "replicas are not defined (it has no constant stride)."
            )
        return ReplicaGrouping._from_params(replica_count, rg.stride, rg.group_size)

    def groups(self, replica_count: int) -> List[List[int]]:
        """The replicas of each group, groups in order."""
        rg = self._for(replica_count)
        return [rg.replicas_of_group(g) for g in range(rg.num_groups)]

    def getGroupCount(self, replica_count: int) -> int:
        return self._for(replica_count).num_groups

    def getRetrievalMode(self) -> str:
        return self._retrieval_mode

    def numReplicasReturningVariable(self, replica_count: int) -> int:
        if self._retrieval_mode == "all_replicas":
            return replica_count
        return self.getGroupCount(replica_count)


def _infer_stride(assignment: List[int]) -> Optional[int]:
    members = [i for i, g in enumerate(assignment) if g == assignment[0]] if assignment else []
    if len(members) < 2:
        return 1
    steps = {b - a for a, b in zip(members, members[1:])}
    return steps.pop() if len(steps) == 1 else None


def _const_runs(assignment: List[int]) -> List[List[int]]:
    """Each group's members split where the gap between consecutive members exceeds the
    smallest gap of any group: the pieces that can be groups of one constant stride."""
    groups = [[r for r, g in enumerate(assignment) if g == k] for k in sorted(set(assignment))]
    gaps = [b - a for m in groups for a, b in zip(m, m[1:])]
    smallest = min(gaps, default=1)
    runs = []
    for members in groups:
        runs.append([members[0]])
        for a, b in zip(members, members[1:]):
            if b - a > smallest:
                runs.append([])
            runs[-1].append(b)
    return runs


def _first_seen(keys: List[int], values: List[int]) -> List[int]:
    """For each distinct key in order of first appearance, the value at that position."""
    out, seen = [], set()
    for k, v in zip(keys, values):
        if k not in seen:
            seen.add(k)
            out.append(v)
    return out
