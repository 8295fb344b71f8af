"""Names the docstring examples of the product packages use (`pytest --doctest-modules`)."""

import numpy as np
import pytest
import torch
from torch import nn

import addons
import popxl_core
import popxl_fx


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace.update(
        np=np,
        torch=torch,
        nn=nn,
        popxl=popxl_core,
        popxl_core=popxl_core,
        addons=addons,
        popxl_fx=popxl_fx,
    )
