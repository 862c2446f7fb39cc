"""tracedag.pipeline.dag: execution DAG reconstruction (``build_store``; one chunk of spans:
``tracedag.pipeline.dag.reconstruct.reconstruct``).

``build_store`` is imported on first use (PEP 562): a reader of one submodule (``tracedag show`` reads
``dag.show``) does not pay for the build and the reconstruction (polars, networkx: ~0.5 s CPU). The
function ``reconstruct`` is no longer a name of the package: it was the submodule's name too, and
which of the two ``dag.reconstruct`` gave would depend on what was imported first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracedag.pipeline.dag.build import BuildStats, build_store

__all__ = ["BuildStats", "build_store"]

_HOMES = {"BuildStats": "build", "build_store": "build"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
