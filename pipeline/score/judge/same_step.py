"""Asking an LLM whether two state names denote the same step (``tracedag validate learn --merge semantic``).

The judge's endpoint, key, model and timeout (``config.JudgeConfig``: ``TRACEDAG_JUDGE_MODEL``,
``TRACEDAG_JUDGE_BASE_URL``, ``TRACEDAG_JUDGE_API_KEY`` / ``OPENAI_API_KEY``, ``TRACEDAG_JUDGE_TIMEOUT``),
its client (``client.Judge``: the real ``openai`` client, JSON mode, retries of 429/5xx) and
its cache (``<data>/state/judge_cache.sqlite``, only validated answers stored). The answer is a JSON
object ``{"same": true|false, "confidence": 0..1, "reason": "..."}``. A pair whose request fails
or whose answer is malformed gets no answer (None) and a warning: learning goes on without merging it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tracedag.pipeline.score.judge.cache import JudgeCache, cache_key
from tracedag.pipeline.score.judge.client import Judge, JudgeCallFailed
from tracedag.pipeline.score.judge.config import JudgeConfig, JudgeNotConfigured, JudgeStats, MalformedVerdict
from tracedag.schemas.layout import state_file

logger = logging.getLogger(__name__)

TAG = "validate-same-step/v1"
"""The prompt's version: part of the cache key, so a new prompt asks again."""
CACHE_FILE = "judge_cache.sqlite"  # runner.CACHE_FILE: one cache for every judge question

SYSTEM = (
    "You compare the names of two steps that different successful runs of the same AI agent took at the "
    "same point of their execution (after the same previous step). Decide whether the two names denote "
    "the same step (the same action with the same purpose, named differently), not merely related or "
    "alternative steps. Reply with only a JSON object: "
    '{"same": true or false, "confidence": a number from 0 to 1, "reason": "one short sentence"}.'
)


@dataclass(frozen=True)
class SameStep:
    """A validated answer: the same step or not, how sure, and why."""

    same: bool
    confidence: float
    reason: str


def parse_same_step(text: str | None) -> SameStep:
    """Validate an answer: a JSON object with boolean ``same`` and ``confidence`` in [0, 1]."""
    start = (text or "").find("{")
    if start < 0:
        raise MalformedVerdict("no JSON object in the answer")
    try:
        doc, _ = json.JSONDecoder().raw_decode((text or "")[start:])
    except ValueError as e:
        raise MalformedVerdict(f"invalid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise MalformedVerdict("the answer is not a JSON object")
    same, conf = doc.get("same"), doc.get("confidence")
    if not isinstance(same, bool):
        raise MalformedVerdict(f"same must be true or false, got {same!r}")
    if isinstance(conf, bool) or not isinstance(conf, int | float) or not 0 <= conf <= 1:
        raise MalformedVerdict(f"confidence must be a number from 0 to 1, got {conf!r}")
    reason = doc.get("reason")
    return SameStep(same, float(conf), reason.strip() if isinstance(reason, str) else "")


class SameStepJudge:
    """Asks whether two state names are the same step; ``ask`` never raises for a failed pair."""

    def __init__(self, cfg: JudgeConfig, cache: JudgeCache) -> None:
        # one retry of a transport failure, no re-ask of a malformed answer: that pair just is not merged
        self.cfg: JudgeConfig = replace(cfg, max_retries=min(cfg.max_retries, 1), parse_retries=0)
        self.cache = cache
        self.stats = JudgeStats(model=cfg.model)
        self.judge = Judge(self.cfg, cache, self.stats)

    @property
    def model(self) -> str:
        """The model that answers (recorded with every merge)."""
        return self.cfg.model

    def ask(self, a: str, b: str, after: str) -> SameStep | None:
        """Whether states ``a`` and ``b``, both reached right after ``after``, are one step; None on failure."""
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Previous step: {after}\nStep A: {a}\nStep B: {b}"}]
        key = cache_key(TAG, self.cfg.model, messages)
        hit = self.cache.get(key)
        if hit is not None:
            self.stats.add(cache_hits=1)
            return SameStep(bool(hit["same"]), float(hit["confidence"]), str(hit.get("reason", "")))
        try:
            answer = parse_same_step(self.judge.answer_text(messages))
        except (JudgeCallFailed, MalformedVerdict) as e:
            self.stats.record_error(f"{a} / {b}: {e}")
            logger.warning("semantic merge: no answer for %r / %r (%s); not merged", a, b, e)
            return None
        except Exception as e:  # an asking problem must never stop learning
            self.stats.record_error(f"{a} / {b}: {type(e).__name__}: {e}")
            logger.warning("semantic merge: no answer for %r / %r (%s: %s); not merged", a, b, type(e).__name__, e)
            return None
        self.cache.put(key, TAG, self.cfg.model, answer.__dict__)
        return answer

    def close(self) -> None:
        """Close the client and the cache."""
        self.judge.close()
        self.cache.close()


def same_step_judge(data: Path, **overrides: Any) -> SameStepJudge:
    """The asker for ``--merge semantic`` from the judge's configuration (env vars, non-None ``overrides``
    such as ``model`` and ``base_url``); ``JudgeNotConfigured`` names what to set when none is configured."""
    hint = ("--merge semantic asks an LLM and none is configured: set TRACEDAG_JUDGE_MODEL (or --judge-model) and "
            "either TRACEDAG_JUDGE_BASE_URL (or --judge-base-url) for an OpenAI-compatible server, or an API key "
            "in TRACEDAG_JUDGE_API_KEY / OPENAI_API_KEY")
    try:
        cfg = JudgeConfig.from_env(**overrides).with_key()
    except JudgeNotConfigured as e:
        raise JudgeNotConfigured(f"{hint} ({e})") from e
    return SameStepJudge(cfg, JudgeCache(state_file(data, CACHE_FILE)))
