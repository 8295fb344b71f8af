"""The entries of the lowering table, one module per op family.

Importing this package imports every module in it, so a new file registers its entries
without touching this one.
"""

import importlib
import pkgutil

__all__: list = []

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    importlib.import_module(f"{__name__}.{_info.name}")
