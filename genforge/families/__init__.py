"""The families genforge trains, one folder each. Every sub-package registers itself (genforge.core.registry:
`register_family`) when imported; importing this package imports them all, so adding a family is adding a folder
(docs/adding-a-family.md)."""

import importlib
import pkgutil

for _family in pkgutil.iter_modules(__path__):
    if _family.ispkg:
        importlib.import_module(f"{__name__}.{_family.name}")
