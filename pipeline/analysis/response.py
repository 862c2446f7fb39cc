"""Response consistency on the 1–4 scale: an LLM judge when configured, else an offline measure.

Scale: 4 = the responses all agree in meaning, 3 = they agree on the main point with minor
differences, 2 = they partly agree, 1 = they contradict each other or are unrelated.

- ``JudgeScorer`` asks an OpenAI-compatible chat endpoint (the real ``openai`` client, temperature
  0) for one digit on that rubric; its method name is ``judge:<model>``. The key comes from
  ``TRACEDAG_JUDGE_API_KEY``, else ``OPENAI_API_KEY``.
- ``TokenJaccardScorer`` needs no network: responses are lower-cased and split into word tokens,
  and the score is ``1 + 3 * J`` where J is the mean pairwise Jaccard similarity of the token sets
  (two empty sets count as identical). Its method name is ``token_jaccard_offline``; it measures
  lexical overlap, not meaning, and every output labels it as such. J is exact while the distinct
  token sets form at most 40,000 pairs; above that it is estimated from 40,000 seeded random pairs
  (``pairs.mean_pairwise_jaccard``: unbiased, within ±0.03 of the exact score on the 1–4 scale with
  99.9 % confidence, the same figure on every run) and the method is
  ``token_jaccard_offline_sampled``.

A single response agrees with itself: 4.0. Runs without any response give null.
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from tracedag.pipeline.analysis.pairs import mean_pairwise_jaccard
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

OFFLINE_METHOD = "token_jaccard_offline"
OFFLINE_SAMPLED_METHOD = "token_jaccard_offline_sampled"
"""The offline method when J was estimated from sampled pairs (see ``pairs``)."""
_TOKEN = re.compile(r"\w+", re.UNICODE)
_DIGIT = re.compile(r"[1-4]")

RUBRIC = (
    "You compare the final answers that several runs of the same AI agent gave to the same task. "
    "Rate how much they agree in meaning (facts, decisions, outcome), ignoring wording and style. "
    "Reply with one digit only: 4 = all agree; 3 = agree on the main point with minor differences; "
    "2 = partly agree; 1 = contradict each other or are unrelated."
)


class JudgeFailed(TracedagError):  # type: ignore[misc,unused-ignore]
    """The judge endpoint failed or answered outside the 1–4 scale."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"judge {model}: {reason}")
        self.model = model
        self.reason = reason


@dataclass(frozen=True)
class Agreement:
    """An agreement on the 1–4 scale and the method that produced it."""

    value: float
    method: str


class ResponseScorer(Protocol):
    """Scores the agreement of responses on the 1–4 scale."""

    method: str

    def agreement(self, responses: list[str]) -> float:
        """Agreement of two or more responses (1–4)."""
        ...

    def measure(self, responses: list[str], key: str) -> Agreement:
        """Agreement of the responses of one group (``key`` names it) with the method used."""
        ...


def tokens(text: str | None) -> frozenset[str]:
    """Lower-cased word tokens of ``text``."""
    return frozenset(_TOKEN.findall((text or "").lower()))


class TokenJaccardScorer:
    """Offline fallback: ``1 + 3 * mean pairwise token-set Jaccard`` (exact, or sampled: see ``pairs``)."""

    method = OFFLINE_METHOD

    def agreement(self, responses: list[str]) -> float:
        """1 + 3 x the mean pairwise Jaccard of the responses' token sets."""
        return self.measure(responses, "").value

    def measure(self, responses: list[str], key: str) -> Agreement:
        """The agreement, labelled ``token_jaccard_offline_sampled`` when it is an estimate."""
        if len(responses) < 2:
            return Agreement(4.0, self.method)
        mean = mean_pairwise_jaccard([tokens(r) for r in responses], key)
        return Agreement(1.0 + 3.0 * mean.value, OFFLINE_SAMPLED_METHOD if mean.estimated else self.method)


class JudgeScorer:
    """LLM judge behind an OpenAI-compatible endpoint, rubric ``RUBRIC``, temperature 0."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None) -> None:
        from openai import OpenAI

        self.model = model
        self.method = f"judge:{model}"
        key = api_key or os.environ.get("TRACEDAG_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self._client = OpenAI(base_url=base_url, api_key=key or "unused", max_retries=2)
        self._cache: dict[tuple[str, ...], float] = {}

    def measure(self, responses: list[str], key: str) -> Agreement:
        """The judge's agreement (``key`` is not used: the judge sees every response)."""
        return Agreement(self.agreement(responses), self.method)

    def agreement(self, responses: list[str]) -> float:
        """Ask the judge for one digit 1–4 (cached per set of responses)."""
        if len(responses) < 2:
            return 4.0
        key = tuple(responses)
        if key not in self._cache:
            self._cache[key] = self._ask(responses)
        return self._cache[key]

    def _ask(self, responses: list[str]) -> float:
        listing = "\n\n".join(f"Answer {i + 1}:\n{r}" for i, r in enumerate(responses))
        try:
            reply = self._client.chat.completions.create(
                model=self.model, temperature=0, max_tokens=4,
                messages=[{"role": "system", "content": RUBRIC}, {"role": "user", "content": listing}],
            )
        except Exception as e:  # the client raises many transport and API error types
            raise JudgeFailed(self.model, f"{type(e).__name__}: {e}") from e
        text = reply.choices[0].message.content or ""
        match = _DIGIT.search(text)
        if match is None:
            raise JudgeFailed(self.model, f"answer {text!r} is not a digit 1-4")
        return float(match.group())


def make_scorer(model: str | None, base_url: str | None = None) -> ResponseScorer:
    """The judge when a model is configured, else the offline token-Jaccard scorer."""
    if model:
        return JudgeScorer(model, base_url)
    return TokenJaccardScorer()


def replay_consistency(scorer: ResponseScorer, responses: list[str | None], key: str = "") -> Agreement | None:
    """Agreement of the replays' final responses (``key`` names the group); null when none has one."""
    present = [r for r in responses if r]
    if not present:
        return None
    return scorer.measure(present, key)


def variant_consistency(
    scorer: ResponseScorer, bases: list[str | None], variants: list[str | None]
) -> float | None:
    """Mean agreement over every (exact replay, variant) pair that both have a response (EDGE: each
    variant is compared with each exact replay); null without such a pair. Equal pairs are scored once."""
    pairs = Counter((b, v) for v in variants if v for b in bases if b)
    if not pairs:
        return None
    total = sum(n * scorer.agreement([b, v]) for (b, v), n in pairs.items())
    return total / sum(pairs.values())
