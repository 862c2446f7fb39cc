"""Step scoring: deterministic rules, evaluations in the spans, an LLM judge, human labels.

``score_store(data, judge=None, progress=False)`` fills ``step_scores`` for every built step not
scored yet; ``JudgeConfig.from_env()`` configures the judge; ``stats_renderable(stats)`` gives the
final rich tables (steps by source, failures by category, judge tokens and cost).
"""

from tracedag.pipeline.score.judge.config import JudgeConfig, JudgeStats
from tracedag.pipeline.score.report import stats_renderable
from tracedag.pipeline.score.runner import ScoreStats, score_store

__all__ = ["JudgeConfig", "JudgeStats", "ScoreStats", "score_store", "stats_renderable"]
