"""The regression gate (DESIGN.md section 9, AgentEval section 3.4): two run selections paired by
scenario, every metric's mean paired difference with a seeded paired-bootstrap interval, dual
thresholds with warn and fail levels, and the outputs CI reads (``report``).

``run_regress(data, baseline, candidate, config)`` -> ``RegressResult`` (``exit_code`` 0 or 1);
usage and data errors raise ``RegressError`` (exit 2).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracedag.pipeline.regress.config import RegressConfig, load_config, parse_config
    from tracedag.pipeline.regress.gate import run_regress
    from tracedag.pipeline.regress.model import FAMILIES, MetricResult, RegressError, RegressResult

__all__ = ["FAMILIES", "MetricResult", "RegressConfig", "RegressError", "RegressResult", "load_config",
           "parse_config", "run_regress"]

_HOME = {"RegressConfig": "config", "load_config": "config", "parse_config": "config", "run_regress": "gate",
         "FAMILIES": "model", "MetricResult": "model", "RegressError": "model", "RegressResult": "model"}
"""Where each name lives. They are imported when first asked for: the gate loads polars and numpy (~0.6 s), which
a reader of saved reports (``regress.saved``: ``tracedag serve``, ``tracedag report``) does not need."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
