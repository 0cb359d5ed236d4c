"""Kernels of the fused ops that composites (and pattern fusion) produce, one composite family per module.

Every module in this package is imported here, so a new fused kernel registers itself by existing.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
del _info
