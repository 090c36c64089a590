"""A part's public face whose names are imported on first use (PEP 562 ``__getattr__``).

Why: a Spark task that needs one decoder of a part (``loglake.archives``' column decoder, say)
imports the part's face, and an eager face would import the part's nodes, BitTorrent and the
storage engine in every task (1.4 s and 466 modules for ``loglake.archives``, measured). Each
part lists ``{name: defining module}``; this module is the one implementation of the hook.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(
    module: str, face: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of package ``module`` whose names are ``face``'s
    keys, each imported from its module when first used (then cached in the package)."""
    namespace = sys.modules[module].__dict__

    def __getattr__(name: str) -> Any:
        if name in face:
            value = getattr(importlib.import_module(face[name]), name)
            namespace[name] = value  # later lookups skip this hook
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(face))

    return __getattr__, __dir__
