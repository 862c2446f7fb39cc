"""LLM judge configuration, verdict validation, model families and token/cost accounting.

Configuration: constructor argument > environment variable > default.

``TRACEDAG_JUDGE_BASE_URL``
    OpenAI-compatible endpoint (default: the OpenAI API).
``TRACEDAG_JUDGE_MODEL``
    Judge model; setting it turns the judge on for ``tracedag score``.
``TRACEDAG_JUDGE_API_KEY`` (else ``OPENAI_API_KEY``)
    API key; a custom base URL without a key sends a placeholder (local servers ignore it).
``TRACEDAG_JUDGE_CONCURRENCY``
    Requests in flight at once (default 4).
``TRACEDAG_JUDGE_TIMEOUT``
    Seconds per request (default 60).
``TRACEDAG_JUDGE_PRICE_IN`` / ``TRACEDAG_JUDGE_PRICE_OUT``
    USD per million input / output tokens, overriding the built-in price table.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tracedag.schemas.errors import TracedagError

# USD per million (input, output) tokens; the longest matching model-name prefix wins.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-5-sonnet": (3.00, 15.00),
}

_FAMILIES: tuple[tuple[str, str], ...] = (
    ("openai", r"^(gpt|o[1-9]\b|o[1-9]-|chatgpt|davinci|babbage)"),
    ("anthropic", r"^claude"),
    ("google", r"^(gemini|gemma|palm|text-bison|chat-bison)"),
    ("meta", r"^(llama|meta-llama)"),
    ("mistral", r"^(mistral|mixtral|codestral|ministral|magistral|pixtral)"),
    ("qwen", r"^(qwen|qwq)"),
    ("deepseek", r"^deepseek"),
    ("xai", r"^grok"),
    ("microsoft", r"^phi-?\d"),
    ("cohere", r"^(command|c4ai)"),
)


class JudgeNotConfigured(TracedagError):  # type: ignore[misc, unused-ignore]
    """The judge was requested without a model."""


def model_family(model: str | None) -> str | None:
    """The vendor family of a model name (``openai/gpt-4o`` -> openai), or None when unknown."""
    if not model:
        return None
    name = model.strip().lower().rsplit("/", 1)[-1].split(":", 1)[0]
    for family, pattern in _FAMILIES:
        if re.match(pattern, name):
            return family
    return None


@dataclass(frozen=True)
class JudgeConfig:
    """Everything the judge needs; build it with ``JudgeConfig.from_env(model=...)``."""

    model: str
    base_url: str | None = None
    api_key: str | None = None
    concurrency: int = 4
    timeout_s: float = 60.0
    max_retries: int = 4
    """Retries of one request on 429, 5xx, timeouts and connection errors (exponential backoff)."""
    parse_retries: int = 2
    """Re-asks after an answer that is not a valid verdict, before recording a judge error."""
    max_backoff_s: float = 30.0
    json_mode: bool = True
    """Send ``response_format={"type": "json_object"}``."""
    max_chars: int = 4000
    """Longest input/output text shown to the judge (each upstream output gets a quarter)."""
    max_upstream: int = 5
    max_steps: int | None = None
    """Judge at most this many steps per run (the rest wait for the next run)."""
    price_in: float | None = None
    price_out: float | None = None
    rubric_dir: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> JudgeConfig:
        """Build a config from ``TRACEDAG_JUDGE_*`` variables, with non-None ``overrides`` winning."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            "model": env.get("TRACEDAG_JUDGE_MODEL"),
            "base_url": env.get("TRACEDAG_JUDGE_BASE_URL") or None,
            "api_key": env.get("TRACEDAG_JUDGE_API_KEY") or env.get("OPENAI_API_KEY") or None,
        }
        for key, name, conv in (("concurrency", "CONCURRENCY", int), ("timeout_s", "TIMEOUT", float),
                                ("price_in", "PRICE_IN", float), ("price_out", "PRICE_OUT", float)):
            if env.get(f"TRACEDAG_JUDGE_{name}"):
                try:
                    values[key] = conv(env[f"TRACEDAG_JUDGE_{name}"])
                except ValueError:
                    raise JudgeNotConfigured(f"judge: TRACEDAG_JUDGE_{name} is not a number") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        if not values.get("model"):
            raise JudgeNotConfigured("judge: no model (set TRACEDAG_JUDGE_MODEL or --judge-model)")
        return cls(**values)

    def with_key(self) -> JudgeConfig:
        """This config with an API key, a placeholder for custom endpoints that need none."""
        if self.api_key:
            return self
        if self.base_url:
            return replace(self, api_key="tracedag-no-key")
        raise JudgeNotConfigured("judge: no API key (TRACEDAG_JUDGE_API_KEY or OPENAI_API_KEY)")

    def prices(self) -> tuple[float, float] | None:
        """USD per million (input, output) tokens for the judge model, or None when unknown."""
        if self.price_in is not None and self.price_out is not None:
            return self.price_in, self.price_out
        name = self.model.lower().rsplit("/", 1)[-1]
        matches = [p for p in DEFAULT_PRICES if name.startswith(p)]
        return DEFAULT_PRICES[max(matches, key=len)] if matches else None


@dataclass
class JudgeStats:
    """Calls, cache hits, retries, errors, tokens and cost of one judge run (thread-safe adds)."""

    model: str = ""
    judged: int = 0
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    malformed: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    same_family_models: list[str] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        """Add to counters under the lock."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def record_error(self, message: str) -> None:
        """Count a recorded judge error and keep a few samples."""
        with self._lock:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(message[:300])

    def price(self, prices: tuple[float, float] | None) -> None:
        """Compute ``cost_usd`` from the token counts."""
        if prices is not None:
            self.cost_usd = (self.input_tokens * prices[0] + self.output_tokens * prices[1]) / 1e6


class MalformedVerdict(ValueError):
    """The judge's answer is not a valid verdict."""


@dataclass(frozen=True)
class Verdict:
    """A validated judge answer."""

    score: int
    explanation: str
    taxonomy_l3: str | None


def _first_json_object(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise MalformedVerdict("no JSON object in the answer")
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError as e:
        raise MalformedVerdict(f"invalid JSON: {e}") from e
    return value


def parse_verdict(text: str | None) -> Verdict:
    """Validate a judge answer: a JSON object with an integer score 1-5 and an explanation."""
    doc = _first_json_object(text or "")
    if not isinstance(doc, dict):
        raise MalformedVerdict("the answer is not a JSON object")
    score = doc.get("score")
    if isinstance(score, bool) or not isinstance(score, int | float) or score != int(score):
        raise MalformedVerdict(f"score must be an integer, got {score!r}")
    if not 1 <= score <= 5:
        raise MalformedVerdict(f"score {score} outside 1-5")
    explanation = doc.get("explanation")
    if not isinstance(explanation, str) or not explanation.strip():
        raise MalformedVerdict("explanation missing")
    l3 = doc.get("taxonomy_l3")
    if l3 is not None and not isinstance(l3, str):
        raise MalformedVerdict(f"taxonomy_l3 must be a string or null, got {l3!r}")
    return Verdict(int(score), explanation.strip(), l3 or None)
