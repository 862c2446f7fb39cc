"""The regression gate (DESIGN.md section 9, AgentEval section 3.4): two run selections paired by
scenario, every metric's mean paired difference with a seeded paired-bootstrap interval, dual
thresholds with warn and fail levels, and the outputs CI reads (``report``).

``run_regress(data, baseline, candidate, config)`` -> ``RegressResult`` (``exit_code`` 0 or 1);
usage and data errors raise ``RegressError`` (exit 2).
"""

from tracedag.pipeline.regress.config import RegressConfig, load_config, parse_config
from tracedag.pipeline.regress.gate import run_regress
from tracedag.pipeline.regress.model import FAMILIES, MetricResult, RegressError, RegressResult

__all__ = ["FAMILIES", "MetricResult", "RegressConfig", "RegressError", "RegressResult", "load_config",
           "parse_config", "run_regress"]
