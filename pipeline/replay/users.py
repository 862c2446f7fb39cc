"""Simulated users (EDGE §3.1): intents from the DFS paths of an agent graph, personas, and the user
that plays an intent — scripted offline, or a model behind an OpenAI-compatible endpoint.

An intent is one start -> terminal path of the graph. The user's turns follow its branch points
(the nodes of the path with more than one successor): turn *i* asks for the *i*-th branch the path
takes, stated from the edge's ``condition``, else the target node's first ``intents`` entry, else its
description, else its name. A target may bring its own phrasing of a path (``scripted_turns(path,
index)``, as the bundled example agent does), which the scripted user then speaks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tracedag.pipeline.analysis.paths import enumerate_paths
from tracedag.pipeline.replay.targets import ReplayTargetError, describe_error
from tracedag.schemas.agent_graph import AgentGraph
from tracedag.schemas.errors import TracedagError


class PersonaInvalid(TracedagError):  # type: ignore[misc,unused-ignore]
    """A personas file that cannot be read, or a persona it does not name."""


@dataclass(frozen=True)
class Persona:
    """A simulated user's style: the name labels its runs (variant_id)."""

    name: str
    prompt: str
    temperature: float = 0.7


@dataclass(frozen=True)
class Intent:
    """One path of the graph the user wants the agent to take, and the branch asks along it."""

    intent_id: str
    path: tuple[str, ...]
    asks: tuple[str, ...]

    @property
    def transitions(self) -> int:
        """Transitions of the path (a one-node path has none)."""
        return len(self.path) - 1


def load_personas(path: Path | None = None) -> list[Persona]:
    """The personas of a YAML file (``personas: [{name, prompt, temperature}]``); default: the bundled file."""
    try:
        text = path.read_text(encoding="utf-8") if path else (
            resources.files("tracedag.pipeline.replay").joinpath("personas.yaml").read_text(encoding="utf-8"))
        raw = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as e:
        raise PersonaInvalid(f"personas {path}: cannot read: {describe_error(e)}") from e
    items = raw.get("personas") if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not items:
        raise PersonaInvalid(f"personas {path}: expected a list under 'personas'")
    return [_persona(item, i, path) for i, item in enumerate(items)]


def _persona(item: object, index: int, path: Path | None) -> Persona:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        raise PersonaInvalid(f"personas {path}: entry {index + 1} needs a name")
    temp = item.get("temperature", 0.7)
    if not isinstance(temp, int | float) or not 0 <= temp <= 2:
        raise PersonaInvalid(f"personas {path}: {item['name']}: temperature must be a number in 0..2")
    prompt = item.get("prompt", item.get("style", ""))
    return Persona(str(item["name"]), str(prompt or ""), float(temp))


def select_personas(personas: Sequence[Persona], names: Sequence[str]) -> list[Persona]:
    """The personas named (all when none are); an unknown name is a ``PersonaInvalid``."""
    if not names:
        return list(personas)
    known = {p.name: p for p in personas}
    for name in names:
        if name not in known:
            raise PersonaInvalid(f"--persona {name}: unknown persona (known: {', '.join(known)})")
    return [known[n] for n in names]


def intents(graph: AgentGraph, max_visits: int = 1, limit: int = 200) -> list[Intent]:
    """The DFS paths of ``graph`` as intents ``i01``, ``i02``... (at most ``limit``)."""
    out: list[Intent] = []
    for path in enumerate_paths(graph, max_visits):
        if len(out) >= limit:
            break
        out.append(Intent(f"i{len(out) + 1:02d}", tuple(path), branch_asks(graph, path)))
    return out


def branch_asks(graph: AgentGraph, path: Sequence[str]) -> tuple[str, ...]:
    """What the user asks for at each branch point of ``path`` (at least one ask)."""
    asks = [_ask(graph, src, dst) for src, dst in zip(path, path[1:], strict=False) if len(graph.successors(src)) > 1]
    if not asks:
        asks = [_ask(graph, path[0], path[1]) if len(path) > 1 else _describe(graph, path[0])]
    return tuple(asks)


def _ask(graph: AgentGraph, src: str, dst: str) -> str:
    for e in graph.edges:
        if e.source == src and e.target == dst and e.condition:
            return str(e.condition)
    return _describe(graph, dst)


def _describe(graph: AgentGraph, name: str) -> str:
    node = next(n for n in graph.nodes if n.name == name)
    return str(node.intents[0] if node.intents else (node.description or name))


_OPENERS = ("{ask}.", "I'd like this: {ask}.", "Please: {ask}.")


@dataclass(frozen=True)
class ScriptedUser:
    """Offline: states each branch ask of the intent, phrased by a seeded choice (or the target's own phrasing)."""

    seed: int
    phrasing: Callable[[Sequence[str], int], Sequence[str]] | None = None

    def turns(self, intent: Intent, persona: Persona, conversation: int) -> list[str]:
        """Every turn of one attempt (deterministic in seed, intent, persona and conversation)."""
        pick = random.Random(f"{self.seed}:{intent.intent_id}:{persona.name}:{conversation}").randrange(3)
        if self.phrasing is not None:
            return list(self.phrasing(intent.path, pick))
        return [_OPENERS[pick].format(ask=a) for a in intent.asks]

    def next_turn(self, intent: Intent, persona: Persona, conversation: int, index: int,
                  replies: Sequence[str]) -> str | None:
        """Turn ``index`` of the script (None when it is spoken out)."""
        turns = self.turns(intent, persona, conversation)
        return turns[index] if index < len(turns) else None


SYSTEM = ("You play a user talking to an assistant (a software agent). Stay in the role of the user; "
          "write only the user's next message. {style}\nWhat you want overall: {goal}.")
TURN = "Your next message must ask for this, in your own words: {ask}."


@dataclass
class ModelUser:
    """A model behind an OpenAI-compatible endpoint plays the user, with the persona's prompt and temperature."""

    model: str
    base_url: str | None = None
    seed: int = 7
    client: Any = None

    def __post_init__(self) -> None:
        if self.client is None:
            try:
                import openai
            except ImportError as e:
                raise ReplayTargetError("--user-model needs the openai client: pip install 'tracedag[judge]'") from e
            import os

            api_key = os.environ.get("OPENAI_API_KEY") or "not-needed"  # local endpoints take none
            self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=1, timeout=60)

    def next_turn(self, intent: Intent, persona: Persona, conversation: int, index: int,
                  replies: Sequence[str]) -> str | None:
        """The model's message for branch ask ``index`` (None once every ask is made), given the agent's replies."""
        if index >= len(intent.asks):
            return None
        goal = "; then ".join(intent.asks)
        messages: list[dict[str, str]] = [
            {"role": "system", "content": SYSTEM.format(style=persona.prompt, goal=goal)}]
        for reply in replies:
            messages.append({"role": "user", "content": reply})  # the agent speaks to the simulated user
        messages.append({"role": "user", "content": TURN.format(ask=intent.asks[index])})
        out = self.client.chat.completions.create(model=self.model, temperature=persona.temperature,
                                                  messages=messages, seed=self.seed + conversation)
        return (out.choices[0].message.content or "").strip() or intent.asks[index]
