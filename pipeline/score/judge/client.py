"""Asking the judge: the real ``openai`` client, retries with backoff, validation, cache, concurrency.

Transport failures (429 honouring ``Retry-After``, 5xx, timeouts, lost connections) are retried
with exponential backoff; an answer that is not a valid verdict is re-asked with the reason;
after the last try the step gets a recorded judge error (counted, logged), never an exception.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import openai

from tracedag.pipeline.score.judge.cache import JudgeCache, cache_key
from tracedag.pipeline.score.judge.config import (
    JudgeConfig,
    JudgeStats,
    MalformedVerdict,
    Verdict,
    parse_verdict,
)
from tracedag.pipeline.score.judge.rubrics import JudgeInput, Rubric, system_prompt, user_prompt
from tracedag.pipeline.score.rows import ScoreRow, categorize
from tracedag.pipeline.score.taxonomy import UNCLASSIFIED

logger = logging.getLogger(__name__)


class JudgeCallFailed(Exception):
    """A request failed after its retries (or with an error that retrying cannot fix)."""


@dataclass(frozen=True)
class JudgeTask:
    """One step to grade with one rubric."""

    trace_id: str
    span_id: str
    build_id: str
    rubric: Rubric
    step: JudgeInput


def retry_after_seconds(response: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date)."""
    headers = getattr(response, "headers", None) or {}
    millis: str | None = headers.get("retry-after-ms")
    if millis:
        try:
            return float(millis) / 1000
        except ValueError:
            pass
    value: str | None = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


def _retry_wait(e: Exception, attempt: int, cfg: JudgeConfig) -> float | None:
    """How long to wait before retrying after ``e``, or None when it must not be retried."""
    limit: float = cfg.max_backoff_s
    backoff: float = min(limit, 0.5 * 2**attempt) * random.uniform(0.8, 1.2)
    if isinstance(e, openai.APIStatusError):
        if e.status_code == 429 or e.status_code >= 500:
            hinted = retry_after_seconds(e.response)
            return min(limit, hinted) if hinted is not None else backoff
        return None
    if isinstance(e, openai.APIConnectionError | json.JSONDecodeError):  # timeouts; a broken body
        return backoff
    return None


class Judge:
    """Grades steps with rubrics through an OpenAI-compatible chat-completions endpoint."""

    def __init__(self, cfg: JudgeConfig, cache: JudgeCache, stats: JudgeStats,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg.with_key()
        self.cache = cache
        self.stats = stats
        self.sleep = sleep
        self.json_mode: bool = self.cfg.json_mode
        # retries are ours (counted, bounded); the client must not retry on its own
        self.client = openai.OpenAI(base_url=self.cfg.base_url, api_key=self.cfg.api_key,
                                    timeout=self.cfg.timeout_s, max_retries=0)

    def _rejects_json_mode(self, e: Exception) -> bool:
        """An endpoint that refuses ``response_format``: stop sending it (the answer is validated anyway)."""
        if not (self.json_mode and isinstance(e, openai.BadRequestError) and "response_format" in str(e)):
            return False
        logger.warning("judge endpoint rejects response_format json_object; asking without it")
        self.json_mode = False
        return True

    def _create(self, messages: list[dict[str, str]]) -> Any:
        for attempt in range(self.cfg.max_retries + 1):
            extra: dict[str, Any] = {"response_format": {"type": "json_object"}} if self.json_mode else {}
            try:
                self.stats.add(calls=1)
                return self.client.chat.completions.create(
                    model=self.cfg.model, messages=messages, temperature=0, **extra)  # type: ignore[arg-type]
            except (openai.OpenAIError, json.JSONDecodeError) as e:
                if self._rejects_json_mode(e):
                    continue
                wait = _retry_wait(e, attempt, self.cfg)
                if wait is None or attempt == self.cfg.max_retries:
                    raise JudgeCallFailed(f"{type(e).__name__}: {e}") from e
                logger.info("judge request failed (%s), retry %d in %.1fs", type(e).__name__, attempt + 1, wait)
                self.stats.add(retries=1)
                self.sleep(wait)
        raise JudgeCallFailed("retries exhausted")

    def _ask(self, messages: list[dict[str, str]]) -> Verdict:
        convo = list(messages)
        for attempt in range(self.cfg.parse_retries + 1):
            resp = self._create(convo)
            usage = getattr(resp, "usage", None)
            self.stats.add(input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                           output_tokens=getattr(usage, "completion_tokens", 0) or 0)
            text = resp.choices[0].message.content if resp.choices else None
            try:
                return parse_verdict(text)
            except MalformedVerdict as e:
                self.stats.add(malformed=1)
                if attempt == self.cfg.parse_retries:
                    raise JudgeCallFailed(f"malformed verdict after {attempt + 1} answers: {e}") from e
                convo += [{"role": "assistant", "content": text or ""},
                          {"role": "user", "content": f"That answer is invalid ({e}). Reply with only the JSON object."}]
        raise JudgeCallFailed("no answer")

    def answer_text(self, messages: list[dict[str, str]]) -> str | None:
        """One answer's text, with the transport retries of ``grade`` but no validation (callers with
        their own answer format, such as ``same_step``); ``JudgeCallFailed`` after the last try."""
        resp = self._create(messages)
        usage = getattr(resp, "usage", None)
        self.stats.add(input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                       output_tokens=getattr(usage, "completion_tokens", 0) or 0)
        text: str | None = resp.choices[0].message.content if resp.choices else None
        return text

    def grade(self, task: JudgeTask) -> Verdict | None:
        """The verdict for one task (cached), or None after a recorded judge error."""
        messages = [{"role": "system", "content": system_prompt(task.rubric)},
                    {"role": "user", "content": user_prompt(task.step)}]
        key = cache_key(task.rubric.tag, self.cfg.model, messages)
        hit = self.cache.get(key)
        if hit is not None:
            self.stats.add(cache_hits=1)
            return Verdict(int(hit["score"]), str(hit["explanation"]), hit.get("taxonomy_l3"))
        try:
            verdict = self._ask(messages)
        except JudgeCallFailed as e:
            logger.warning("judge error on %s/%s (%s): %s", task.trace_id, task.span_id, task.rubric.id, e)
            self.stats.record_error(f"{task.span_id} {task.rubric.id}: {e}")
            return None
        except Exception as e:  # a judging problem must never stop the scoring run
            logger.exception("unexpected judge error on %s/%s (%s)", task.trace_id, task.span_id, task.rubric.id)
            self.stats.record_error(f"{task.span_id} {task.rubric.id}: {type(e).__name__}: {e}")
            return None
        self.cache.put(key, task.rubric.tag, self.cfg.model, verdict.__dict__)
        return verdict

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()


def verdict_row(task: JudgeTask, verdict: Verdict, model: str) -> ScoreRow:
    """The ``step_scores`` row of a verdict; a failing one always carries a category."""
    row = ScoreRow(task.trace_id, task.span_id, task.build_id, task.rubric.metric, float(verdict.score), "judge",
                   judge_model=model, rubric_version=task.rubric.tag, explanation=verdict.explanation)
    l3 = verdict.taxonomy_l3
    if l3 and l3 != UNCLASSIFIED:
        reason = f"judge category '{l3}' is not in the taxonomy"
    else:
        reason = "the judge named no category that fits"
    row.category, note = categorize(row.score, l3, reason)
    if note:
        row.explanation = f"{note}; {row.explanation}"
    return row


def run_judge(judge: Judge, tasks: Iterable[JudgeTask], on_done: Callable[[], None] | None = None) -> list[ScoreRow]:
    """Grade ``tasks`` with at most ``concurrency`` requests in flight; return the verdict rows."""
    rows: list[ScoreRow] = []
    with ThreadPoolExecutor(max_workers=max(1, judge.cfg.concurrency)) as pool:
        futures = {pool.submit(judge.grade, t): t for t in tasks}
        for fut in as_completed(futures):
            verdict = fut.result()
            if verdict is not None:
                rows.append(verdict_row(futures[fut], verdict, judge.cfg.model))
                judge.stats.add(judged=1)
            if on_done:
                on_done()
    return rows
