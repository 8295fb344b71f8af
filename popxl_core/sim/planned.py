"""The Session of an Ir built in planning mode (`popxl_core.planning`): a plan, no program.

Such a Session verifies the Ir and plans it exactly as a real one does (the plan is built from
shapes, dtypes and the schedule, never from values), so ``report`` is the report the real
program would get. It compiles nothing and copies no weights; every call that needs values
raises `PlanOnlyError`. An out-of-memory plan is warned of, not raised: a POD configuration
planned on a laptop is planned to see whether it fits.
"""

from __future__ import annotations

import warnings

from ..planning import PlanOnlyError
from .oom import OutOfMemoryError, OutOfMemoryWarning
from .plan import Plan, build_plan

__all__ = ["PlanOnly", "plan_only", "planned"]


def planned(ir, machine) -> Plan:
    """``build_plan``, with out-of-memory a warning (the plan still tells by how much)."""
    try:
        return build_plan(ir, machine)
    except OutOfMemoryError as e:
        warnings.warn(f"{e} (planning mode: reported, not raised)", OutOfMemoryWarning, 3)
        return e.plan


class PlanOnly:
    """What a planning-mode Session refuses: everything that attaches, runs, reads or writes."""

    def _refuse(self, what: str):
        raise PlanOnlyError(
            f"{what}: {self!r} was built in planning mode (popxl_core.planning: "
            "popxl_core.planning.planning() or POPXL_SIM_PLAN set when its Ir was created); "
            "its variables have shapes but no values, so it has a plan and a report "
            "(session.report.summary()) and nothing to run. Build the Ir outside planning mode "
            "to run it."
        )

    def __enter__(self):
        self._refuse("attaching (with session:)")

    def run(self, *args, **kwargs):
        self._refuse("run")

    def run_with_outputs(self, *args, **kwargs):
        self._refuse("run_with_outputs")

    def prepared_run(self, *args, **kwargs):
        self._refuse("prepared_run")

    def weights_from_host(self) -> None:
        self._refuse("weights_from_host")

    def weights_to_host(self) -> None:
        self._refuse("weights_to_host")

    def get_tensors_data(self, *args, **kwargs):
        self._refuse("get_tensor_data")

    def write_variables_data(self, *args, **kwargs):
        self._refuse("write_variables_data")


def plan_only(session) -> None:
    """Make ``session`` (a Session, or a subclass such as addons' TaskSession, whose own
    ``__init__`` goes on after Session's) a planning-mode one: its class becomes a subclass
    with `PlanOnly` first, so every value-needing method refuses whatever overrides it."""
    session._program = None
    session._attached = False
    session.ir._session = session
    session.__class__ = _plan_only_class(type(session))


_PLAN_ONLY: dict[type, type] = {}  # Session class -> its plan-only subclass (made once)


def _plan_only_class(cls: type) -> type:
    if cls not in _PLAN_ONLY:
        name = f"PlanOnly{cls.__name__}"
        _PLAN_ONLY[cls] = type(name, (PlanOnly, cls), {"__module__": cls.__module__})
    return _PLAN_ONLY[cls]
