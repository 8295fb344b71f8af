"""``poptorch`` for Python processes that a PopTorch program starts (`popxl_fx.compat.child_env`
puts this folder first on their PYTHONPATH): it installs the import hook and becomes
`popxl_fx.poptorch`, so ``import poptorch`` there gives what it gives in the program itself.
"""

import importlib
import sys

from popxl_fx import compat

compat.install()
sys.modules[__name__] = importlib.import_module("popxl_fx.poptorch")
