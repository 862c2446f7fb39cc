"""The validation model file: readable, versioned, editable by a person (JSON, or YAML by suffix).

Format (version 1)::

    {"format": "tracedag-validation-model", "version": 1,
     "agent": "court_booking.constrained", "agent_versions": ["1.0"],
     "state": "step_key", "merge": "normalized", "duration_slack": 2.0,
     "learned_from": {"data": "./tracedag-data", "runs": null, "by": null, "at": "2026-12-02T04:00:00Z"},
     "scenarios": {
       "p02": {"runs": ["sim/constrained-p02-base-r0", ...], "prefix_tree_states": 23,
               "states": [{"name": "router", "essential": true, "learned": "essential", "runs": 5,
                           "max_duration_ms": 9.1, "names": ["router"]}, ...],
               "transitions": [{"from": "(start)", "to": "router", "runs": 5}, ...],
               "failure_transitions": [{"from": "router", "to": "book_court", "failed_runs": 2}],
               "excluded_runs": [{"run": "...", "reason": "lacks 'book_court', which the 6 other ..."}],
               "semantic_merges": [{"names": ["availability_check", "check_availability"],
                                    "into": "check_availability", "confidence": 0.97, "model": "gpt-4o-mini",
                                    "after": "router", "reason": "..."}]}}}

A person edits ``essential`` (true/false) to make a state required or optional; ``learned`` keeps
what the learner said. Essential states are checked in the order ``states`` lists them. With
``"merge": "semantic"`` each ``semantic_merges`` entry records names an LLM called the same step
(``semantic``): ``check`` reads every name of an entry as its ``into``; delete an entry to
undo it. Loading
checks every field and names the first bad one (``ModelInvalid``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

FORMAT = "tracedag-validation-model"
VERSION = 1


class ModelInvalid(TracedagError):  # type: ignore[misc,unused-ignore]
    """A model file is unreadable or a field is wrong; ``where`` names the field."""

    def __init__(self, path: str, where: str, reason: str) -> None:
        super().__init__(f"validation model {path}: {where}: {reason}")
        self.path = path
        self.where = where
        self.reason = reason


@dataclass
class StateSpec:
    """One merged state of a scenario."""

    name: str
    essential: bool
    learned: str = "optional"  # essential | optional: what the learner found
    runs: int = 0
    max_duration_ms: float | None = None
    names: list[str] = field(default_factory=list)


@dataclass
class ScenarioModel:
    """The skeleton of one scenario."""

    runs: list[str]
    states: list[StateSpec]
    prefix_tree_states: int = 0
    transitions: list[dict[str, Any]] = field(default_factory=list)
    failure_transitions: list[dict[str, Any]] = field(default_factory=list)
    excluded_runs: list[dict[str, str]] = field(default_factory=list)
    """Passing runs left out as outliers, with the reason (``learning.drop_outliers``)."""
    semantic_merges: list[dict[str, Any]] = field(default_factory=list)
    """Names merged because an LLM called them the same step (``semantic``), for review."""

    @property
    def renames(self) -> dict[str, str]:
        """What the recorded semantic merges stand for: every name of a merge -> its ``into``."""
        out: dict[str, str] = {}
        for m in self.semantic_merges:
            into = str(m["into"])
            out.update({str(n): into for n in m["names"] if str(n) != into})
        return out

    @property
    def essential(self) -> list[str]:
        """The essential states, in the order they must be reached."""
        return [s.name for s in self.states if s.essential]

    def state(self, name: str) -> StateSpec | None:
        """The state called ``name``."""
        return next((s for s in self.states if s.name == name), None)


@dataclass
class Model:
    """A validation model: one skeleton per scenario of one agent."""

    agent: str
    state: str
    merge: str
    scenarios: dict[str, ScenarioModel]
    agent_versions: list[str] = field(default_factory=list)
    duration_slack: float = 2.0
    learned_from: dict[str, Any] = field(default_factory=dict)


def to_dict(model: Model) -> dict[str, Any]:
    """The model as the plain structure written to the file."""
    return {
        "format": FORMAT, "version": VERSION, "agent": model.agent, "agent_versions": model.agent_versions,
        "state": model.state, "merge": model.merge, "duration_slack": model.duration_slack,
        "learned_from": model.learned_from,
        "scenarios": {name: _scenario_dict(s) for name, s in model.scenarios.items()},
    }


def _scenario_dict(s: ScenarioModel) -> dict[str, Any]:
    return {
        "runs": s.runs, "prefix_tree_states": s.prefix_tree_states,
        "states": [
            {"name": st.name, "essential": st.essential, "learned": st.learned, "runs": st.runs,
             "max_duration_ms": st.max_duration_ms, "names": st.names}
            for st in s.states
        ],
        "transitions": s.transitions, "failure_transitions": s.failure_transitions,
        "excluded_runs": s.excluded_runs,
        **({"semantic_merges": s.semantic_merges} if s.semantic_merges else {}),
    }


def save_model(model: Model, path: Path) -> None:
    """Write the model as YAML when ``path`` ends in .yaml/.yml, else as indented JSON."""
    data = to_dict(model)
    if path.suffix.lower() in (".yaml", ".yml"):
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    else:
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def load_model(path: Path, state_names: tuple[str, ...], merges: tuple[str, ...]) -> Model:
    """Read and check a model file; ``ModelInvalid`` names the first bad field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ModelInvalid(str(path), "file", e.strerror or str(e)) from e
    try:
        raw = yaml.safe_load(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ModelInvalid(str(path), "file", f"not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: "
                                              f"{str(e).splitlines()[0]}") from e
    return from_dict(raw, str(path), state_names, merges)


class _Reader:
    """Field checks that name the field: ``where`` is a dotted path such as ``scenarios.p02.states[3]``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, reason: str) -> ModelInvalid:
        return ModelInvalid(self.path, where, reason)

    def get(self, obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
            required: bool = True, default: Any = None) -> Any:
        at = f"{where}.{key}" if where else key
        if key not in obj:
            if required:
                raise self.fail(at, "missing")
            return default
        value = obj[key]
        bad_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
        if not isinstance(value, kind) or bad_bool:
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self.fail(at, f"must be {_KIND_WORDS.get(names, names)}, got {value!r}")
        return value


_KIND_WORDS = {"bool": "true or false", "str": "a string", "list": "a list", "dict": "a mapping",
               "int": "an integer", "int/float": "a number", "int/float/NoneType": "a number or null"}


def from_dict(raw: Any, path: str, state_names: tuple[str, ...], merges: tuple[str, ...]) -> Model:
    """Check the plain structure of a model file and build the ``Model``."""
    r = _Reader(path)
    if not isinstance(raw, dict):
        raise r.fail("file", "must hold a mapping at the top level")
    if raw.get("format") != FORMAT:
        raise r.fail("format", f"must be {FORMAT!r}, got {raw.get('format')!r} (not a tracedag validation model)")
    version = r.get(raw, "version", int, "")
    if version != VERSION:
        raise r.fail("version", f"{version} is not supported (this tracedag reads version {VERSION})")
    state = r.get(raw, "state", str, "")
    if state not in state_names:
        raise r.fail("state", f"{state!r} is not one of {', '.join(state_names)}")
    merge = r.get(raw, "merge", str, "")
    if merge not in merges:
        raise r.fail("merge", f"{merge!r} is not one of {', '.join(merges)}")
    slack = r.get(raw, "duration_slack", (int, float), "", required=False, default=2.0)
    if slack <= 0:
        raise r.fail("duration_slack", f"must be above 0, got {slack}")
    scenarios = r.get(raw, "scenarios", dict, "")
    if not scenarios:
        raise r.fail("scenarios", "is empty: the model has no scenario to check against")
    return Model(
        agent=r.get(raw, "agent", str, ""), state=state, merge=merge,
        scenarios={str(k): _scenario(r, v, f"scenarios.{k}") for k, v in scenarios.items()},
        agent_versions=[str(v) for v in r.get(raw, "agent_versions", list, "", required=False, default=[])],
        duration_slack=float(slack),
        learned_from=r.get(raw, "learned_from", dict, "", required=False, default={}),
    )


def _scenario(r: _Reader, raw: Any, where: str) -> ScenarioModel:
    if not isinstance(raw, dict):
        raise r.fail(where, f"must be a mapping, got {raw!r}")
    states = [_state(r, s, f"{where}.states[{i}]") for i, s in enumerate(r.get(raw, "states", list, where))]
    seen: set[str] = set()
    for i, s in enumerate(states):
        if s.name in seen:
            raise r.fail(f"{where}.states[{i}].name", f"{s.name!r} appears twice")
        seen.add(s.name)
    if not any(s.essential for s in states):
        logger.warning("%s: %s has no essential state: every run passes", r.path, where)
    return ScenarioModel(
        runs=[str(x) for x in r.get(raw, "runs", list, where, required=False, default=[])], states=states,
        prefix_tree_states=int(r.get(raw, "prefix_tree_states", int, where, required=False, default=0)),
        transitions=_pairs(r, raw, "transitions", where),
        failure_transitions=_pairs(r, raw, "failure_transitions", where),
        excluded_runs=[dict(x) for x in r.get(raw, "excluded_runs", list, where, required=False, default=[])
                       if isinstance(x, dict)],
        semantic_merges=_merges(r, raw, where),
    )


def _merges(r: _Reader, raw: dict[str, Any], where: str) -> list[dict[str, Any]]:
    items = r.get(raw, "semantic_merges", list, where, required=False, default=[])
    for i, item in enumerate(items):
        at = f"{where}.semantic_merges[{i}]"
        if not isinstance(item, dict):
            raise r.fail(at, f"must be a mapping with names and into, got {item!r}")
        names = r.get(item, "names", list, at)
        if len(names) < 2 or not all(isinstance(n, str) for n in names):
            raise r.fail(f"{at}.names", f"must list at least two state names, got {names!r}")
        if not r.get(item, "into", str, at).strip():
            raise r.fail(f"{at}.into", "is empty")
    return [dict(i) for i in items]


def _state(r: _Reader, raw: Any, where: str) -> StateSpec:
    if not isinstance(raw, dict):
        raise r.fail(where, f"must be a mapping with name and essential, got {raw!r}")
    name = r.get(raw, "name", str, where)
    if not name.strip():
        raise r.fail(f"{where}.name", "is empty")
    learned = r.get(raw, "learned", str, where, required=False, default="optional")
    if learned not in ("essential", "optional"):
        raise r.fail(f"{where}.learned", f"must be essential or optional, got {learned!r}")
    duration = r.get(raw, "max_duration_ms", (int, float, type(None)), where, required=False)
    return StateSpec(
        name=name, essential=r.get(raw, "essential", bool, where), learned=learned,
        runs=int(r.get(raw, "runs", int, where, required=False, default=0)),
        max_duration_ms=None if duration is None else float(duration),
        names=[str(n) for n in r.get(raw, "names", list, where, required=False, default=[])],
    )


def _pairs(r: _Reader, raw: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    items = r.get(raw, key, list, where, required=False, default=[])
    for i, item in enumerate(items):
        at = f"{where}.{key}[{i}]"
        if not isinstance(item, dict):
            raise r.fail(at, f"must be a mapping with from and to, got {item!r}")
        r.get(item, "from", str, at)
        r.get(item, "to", str, at)
    return [dict(i) for i in items]


def diff(old: Model, new: Model) -> list[str]:
    """What changed from ``old`` to ``new``, one line per change (empty: nothing changed)."""
    lines: list[str] = []
    for name in sorted(set(old.scenarios) | set(new.scenarios)):
        a, b = old.scenarios.get(name), new.scenarios.get(name)
        if a is None or b is None:
            lines.append(f"scenario {name}: {'added' if a is None else 'removed'}")
            continue
        added_runs = len(set(b.runs) - set(a.runs))
        lines += [f"scenario {name}: {line}" for line in _scenario_diff(a, b)]
        if added_runs and not _scenario_diff(a, b):
            lines.append(f"scenario {name}: {added_runs} new run(s), skeleton unchanged")
    return lines


def _scenario_diff(a: ScenarioModel, b: ScenarioModel) -> list[str]:
    out: list[str] = []
    ea, eb = a.essential, b.essential
    gone = [s for s in ea if s not in eb]
    new = [s for s in eb if s not in ea]
    if gone:
        out.append("no longer essential: " + ", ".join(gone))
    if new:
        out.append("now essential: " + ", ".join(new))
    if not gone and not new and ea != eb:
        out.append(f"essential order changed: {' > '.join(eb)}")
    extra = sorted({s.name for s in b.states} - {s.name for s in a.states} - set(new))
    if extra:
        out.append("new optional states: " + ", ".join(extra))
    return out
