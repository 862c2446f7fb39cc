"""An LLM judge for step tests: a rubric, a threshold, any OpenAI-compatible chat endpoint.

``Judge(model, base_url, api_key)`` posts one ``/chat/completions`` request per grade (temperature
0) asking for ``{"score": 1-5, "explanation": "..."}``; ``Judge.scripted([5, 2, ...])`` returns
the given scores in turn, offline. Every grade is recorded as a ``gen_ai.evaluation.result`` event
on the current span (``run.record_evaluation``), so exported test runs land in ``step_scores``.
Environment (as ``tracedag score``): ``TRACEDAG_JUDGE_MODEL``, ``TRACEDAG_JUDGE_BASE_URL``
(default https://api.openai.com/v1), ``TRACEDAG_JUDGE_API_KEY`` (else ``OPENAI_API_KEY``);
``TRACEDAG_JUDGE_SCRIPT=5,4,2`` makes the scripted judge.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import cycle
from typing import Any

from tracedag.testing.run import record_evaluation

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_SYSTEM = ("You grade one step of an AI agent against a rubric. Answer only with JSON: "
           '{"score": <integer 1-5, 5 = fully meets the rubric, 1 = fails it>, "explanation": "<one sentence>"}')
_SCORE = re.compile(r'"score"\s*:\s*([1-5])')


class JudgeError(RuntimeError):
    """The endpoint failed or answered without a score."""


@dataclass(frozen=True)
class JudgeResult:
    """One grade."""

    score: int
    threshold: int
    explanation: str = ""

    @property
    def passed(self) -> bool:
        """True when the score reaches the threshold."""
        return self.score >= self.threshold


class Judge:
    """Grades outputs against a rubric (see the module docstring)."""

    def __init__(self, model: str | None = None, base_url: str | None = None, api_key: str | None = None,
                 rubric: str = "The output does what the step is for, correctly and completely.",
                 threshold: int = 4, timeout: float = 60.0, metric: str = "judge") -> None:
        self.model = model
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key
        self.rubric = rubric
        self.threshold = threshold
        self.timeout = timeout
        self.metric = metric
        self._script: Iterator[int] | None = None

    @classmethod
    def scripted(cls, scores: Iterable[int], **kw: Any) -> Judge:
        """A judge that returns ``scores`` in turn (cycling), with no endpoint."""
        judge = cls(model="scripted", **kw)
        judge._script = cycle([int(s) for s in scores])
        return judge

    @classmethod
    def from_env(cls, **kw: Any) -> Judge | None:
        """The judge the environment configures, or None."""
        script = os.environ.get("TRACEDAG_JUDGE_SCRIPT")
        if script:
            return cls.scripted([int(s) for s in script.split(",") if s.strip()], **kw)
        model = os.environ.get("TRACEDAG_JUDGE_MODEL")
        if not model:
            return None
        key = os.environ.get("TRACEDAG_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        return cls(model, os.environ.get("TRACEDAG_JUDGE_BASE_URL"), key, **kw)

    def grade(self, output: Any, rubric: str | None = None, threshold: int | None = None,
              context: Any = None, record: bool = True) -> JudgeResult:
        """Grade ``output`` (with optional ``context``, e.g. the case's messages) on 1-5."""
        score, explanation = self._ask(output, rubric or self.rubric, context)
        result = JudgeResult(score, self.threshold if threshold is None else threshold, explanation)
        if record:
            record_evaluation(self.metric, score, None, explanation)
        return result

    def _ask(self, output: Any, rubric: str, context: Any) -> tuple[int, str]:
        if self._script is not None:
            return next(self._script), "scripted judge"
        user = f"Rubric: {rubric}\n\n" + (f"Context: {_text(context)}\n\n" if context is not None else "") \
            + f"Output to grade: {_text(output)}"
        body = {"model": self.model, "temperature": 0,
                "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]}
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", json.dumps(body).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                reply = json.loads(response.read())
            content = str(reply["choices"][0]["message"]["content"])
        except (OSError, ValueError, KeyError, IndexError) as e:
            raise JudgeError(f"judge {self.model} at {self.base_url}: {e}") from e
        return _parse(content)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _parse(content: str) -> tuple[int, str]:
    try:
        doc = json.loads(content[content.find("{"): content.rfind("}") + 1])
        score = int(doc["score"])
        if 1 <= score <= 5:
            return score, str(doc.get("explanation", ""))
    except (ValueError, KeyError, TypeError):
        pass
    match = _SCORE.search(content)
    if match is None:
        raise JudgeError(f"judge answered without a 1-5 score: {content[:200]!r}")
    return int(match.group(1)), ""
