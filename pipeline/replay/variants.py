"""Variants of a conversation: every user turn rewritten K ways (``--variants K``), ``variant_id`` v1..vK.

Offline (the default) the rewrites are deterministic rules that keep what the user asks and vary how:
polite (adds "please", else "thanks"), synonyms ("book" -> "reserve", "hi" -> "hello", "I'd like" ->
"I want", ...), casual (lower case, no final punctuation), expanded contractions ("I'd" -> "I would").
Variant ``vk`` is the k-th distinct rewrite among each rule alone, then pairs of rules, then
triples... (cycled when a short turn has fewer), so variants differ from the base and, as far as
the rules allow, from each other. With ``--rewrite-model`` a model behind any OpenAI-compatible endpoint rewrites
each turn instead (temperature 0, the variant number in the prompt; one request per turn and
variant, cached within the replay).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracedag.pipeline.replay.targets import ReplayTargetError

_SYNONYMS = (
    (r"\bI'd like to\b", "I want to"), (r"\bI would like to\b", "I want to"), (r"\bbook\b", "reserve"),
    (r"\bHi\b", "Hello"), (r"\bHello\b", "Hi"), (r"\bcan I\b", "could I"), (r"\bCan I\b", "Could I"),
    (r"\bWhat are\b", "Which are"), (r"\bgo ahead\b", "do it"), (r"\bmaybe\b", "perhaps"),
)
_CONTRACTIONS = (
    (r"\bI'd\b", "I would"), (r"\bI'm\b", "I am"), (r"\bWhat's\b", "What is"), (r"\bwhat's\b", "what is"),
    (r"\bdon't\b", "do not"), (r"\bcan't\b", "cannot"), (r"\bit's\b", "it is"), (r"\bIt's\b", "It is"),
)
_END = re.compile(r"[.!?]+$")


def _polite(text: str) -> str:
    body, end = _split_end(text)
    word = "thanks" if "please" in text.lower() else "please"
    return f"{body}, {word}{end or '.'}"


def _subst(pairs: Sequence[tuple[str, str]]) -> Callable[[str], str]:
    def apply(text: str) -> str:
        for pattern, repl in pairs:
            text = re.sub(pattern, repl, text)
        return text

    return apply


def _casual(text: str) -> str:
    return _END.sub("", text.strip()).lower()


def _split_end(text: str) -> tuple[str, str]:
    stripped = text.strip()
    match = _END.search(stripped)
    return (stripped[: match.start()], match.group(0)) if match else (stripped, "")


RULES: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("polite", _polite), ("synonyms", _subst(_SYNONYMS)), ("casual", _casual), ("expand", _subst(_CONTRACTIONS)),
)


class Rewriter(Protocol):
    """Rewrites one user turn as variant ``k`` (1-based)."""

    def rewrite(self, text: str, k: int) -> str:
        """The turn ``text`` rewritten as variant ``k``."""


@dataclass(frozen=True)
class RuleRewriter:
    """The offline, deterministic rules (module docstring)."""

    def rewrite(self, text: str, k: int) -> str:
        """Variant ``k``: the k-th distinct rewrite (cycled when there are fewer than k)."""
        options = candidates(text)
        return options[(k - 1) % len(options)] if options else text


def candidates(text: str) -> list[str]:
    """Every distinct rewrite of ``text`` the rules give: each rule alone, then pairs, then triples...
    (rules applied in their order), without the text itself."""
    out: list[str] = []
    for size in range(1, len(RULES) + 1):
        for combo in itertools.combinations(range(len(RULES)), size):
            changed = text
            for i in combo:
                changed = RULES[i][1](changed)
            if changed != text and changed not in out:
                out.append(changed)
    return out


PROMPT = ("Rewrite the user's message to a customer-service agent as variant {k}: same request, same facts "
          "(days, times, names, numbers, yes/no), different wording. Reply with the rewritten message only.")


@dataclass
class ModelRewriter:
    """A model behind an OpenAI-compatible endpoint rewrites each turn (cached per turn and variant)."""

    model: str
    base_url: str | None = None
    client: Any = None
    _cache: dict[tuple[str, int], str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.client is None:
            try:
                import openai
            except ImportError as e:
                raise ReplayTargetError("--rewrite-model needs the openai client: pip install 'tracedag[judge]'") from e
            api_key = os.environ.get("OPENAI_API_KEY") or "not-needed"  # local endpoints take none
            self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=1, timeout=60)

    def rewrite(self, text: str, k: int) -> str:
        """The model's rewrite of ``text`` as variant ``k``."""
        with self._lock:
            if (text, k) in self._cache:
                return self._cache[(text, k)]
        reply = self.client.chat.completions.create(
            model=self.model, temperature=0,
            messages=[{"role": "system", "content": PROMPT.format(k=k)}, {"role": "user", "content": text}])
        out = (reply.choices[0].message.content or "").strip() or text
        with self._lock:
            self._cache[(text, k)] = out
        return out


def variant_turns(turns: Sequence[str], k: int, rewriter: Rewriter) -> tuple[str, ...]:
    """Every turn rewritten as variant ``k``."""
    return tuple(rewriter.rewrite(t, k) for t in turns)
