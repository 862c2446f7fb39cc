"""``regress.yaml``: resampling, pairing, score thresholds and per-metric alert levels.

```yaml
resamples: 2000          # paired-bootstrap resamples
confidence: 0.95         # two-sided CI level
seed: 0                  # bootstrap seed (--seed overrides)
min_pairs: 3             # fewer paired units: the metric is 'insufficient' (a warn-level alert)
correction: bh           # p-values adjusted over all metrics: bh (false discovery rate), holm, none
pair_by: [scenario_id, replay_index]   # replay_index is dropped when a side has none
fail_threshold: 2.0      # a step fails at score <= this (queries' $fail_threshold)
pass_threshold: 3.0      # a trace passes at workflow score >= this
default_input_per_mtok: 0.0    # cost_usd: USD per 1M input tokens of a model not in queries/_costs.sql
default_output_per_mtok: 0.0   # cost_usd: USD per 1M output tokens of such a model
absent: warn             # a per-step metric measured on one side only: warn | ok
metrics:                 # a family (model.FAMILIES) or one metric id
  workflow_score: {warn: 0.1, fail: 0.25}
  latency_p95: {warn_rel: 0.1, fail_rel: 0.25}
  step_latency_p95: {enabled: false}
  "step_score[name=calendar_search]": {fail: 0.2}
```
A level of 0 disables it; the effective level is the larger of the absolute and the relative one
(x |baseline mean|). Unknown keys, families or values are errors (``RegressError``, exit 2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tracedag.pipeline.regress.model import FAMILIES, RegressError, Thresholds, family_of

PAIR_LABELS = ("scenario_id", "replay_index", "variant_id", "service_name", "agent_name", "conversation_id")
_THRESHOLD_KEYS = {f.name for f in dataclasses.fields(Thresholds)}


@dataclass(frozen=True)
class RegressConfig:
    """How ``tracedag regress`` compares (defaults: the module docstring)."""

    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    min_pairs: int = 3
    pair_by: tuple[str, ...] = ("scenario_id", "replay_index")
    fail_threshold: float = 2.0
    pass_threshold: float = 3.0
    default_input_per_mtok: float = 0.0
    default_output_per_mtok: float = 0.0
    absent: str = "warn"
    correction: str = "bh"
    metrics: dict[str, Thresholds] = field(default_factory=dict)

    def thresholds(self, metric_id: str) -> Thresholds:
        """The metric's own override, else its family's override, else the family default."""
        return self.metrics.get(metric_id) or self.metrics.get(family_of(metric_id)) \
            or FAMILIES[family_of(metric_id)].thresholds

    def replace(self, **changes: Any) -> RegressConfig:
        """A copy with some fields changed (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def load_config(path: Path | None) -> RegressConfig:
    """Read and check ``regress.yaml`` (the defaults when ``path`` is None)."""
    if path is None:
        return RegressConfig()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise RegressError(f"--config {path}: {e}".splitlines()[0]) from e
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise RegressError(f"--config {path}: expected a mapping at the top, found {type(doc).__name__}")
    return parse_config(doc, str(path))


def parse_config(doc: dict[str, Any], where: str = "config") -> RegressConfig:
    """Check a parsed config mapping and turn it into a ``RegressConfig``."""
    known = {f.name for f in dataclasses.fields(RegressConfig)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise RegressError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for key in ("resamples", "seed", "min_pairs"):
        if key in doc:
            values[key] = _number(where, key, doc[key], int, minimum=1 if key != "seed" else 0)
    for key in ("fail_threshold", "pass_threshold", "default_input_per_mtok", "default_output_per_mtok"):
        if key in doc:
            values[key] = _number(where, key, doc[key], float, minimum=0)
    if "confidence" in doc:
        values["confidence"] = _number(where, "confidence", doc["confidence"], float, minimum=0.5)
        if values["confidence"] >= 1:
            raise RegressError(f"{where}: confidence must be below 1, got {doc['confidence']!r}")
    if "absent" in doc:
        if doc["absent"] not in ("warn", "ok"):
            raise RegressError(f"{where}: absent must be warn or ok, got {doc['absent']!r}")
        values["absent"] = doc["absent"]
    if "correction" in doc:
        if doc["correction"] not in ("bh", "holm", "none"):
            raise RegressError(f"{where}: correction must be bh, holm or none, got {doc['correction']!r}")
        values["correction"] = doc["correction"]
    if "pair_by" in doc:
        values["pair_by"] = _pair_by(where, doc["pair_by"])
    if "metrics" in doc:
        values["metrics"] = _metrics(where, doc["metrics"])
    return RegressConfig(**values)


def _number(where: str, key: str, value: Any, kind: type, minimum: float) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and not isinstance(value, int)):
        raise RegressError(f"{where}: {key} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if value < minimum:
        raise RegressError(f"{where}: {key} must be >= {minimum}, got {value!r}")
    return kind(value)


def _pair_by(where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or any(v not in PAIR_LABELS for v in value):
        raise RegressError(f"{where}: pair_by must be a list of {', '.join(PAIR_LABELS)}, got {value!r}")
    return tuple(value)


def _metrics(where: str, value: Any) -> dict[str, Thresholds]:
    if not isinstance(value, dict):
        raise RegressError(f"{where}: metrics must be a mapping of metric or family to levels")
    out: dict[str, Thresholds] = {}
    for metric, levels in value.items():
        family = family_of(str(metric))
        if family not in FAMILIES:
            raise RegressError(f"{where}: metrics.{metric}: no such metric family (known: {', '.join(FAMILIES)})")
        out[str(metric)] = _levels(f"{where}: metrics.{metric}", FAMILIES[family].thresholds, levels)
    return out


def _levels(where: str, default: Thresholds, levels: Any) -> Thresholds:
    if not isinstance(levels, dict):
        raise RegressError(f"{where}: expected a mapping like {{warn: 0.1, fail: 0.2}}, got {levels!r}")
    unknown = sorted(set(levels) - _THRESHOLD_KEYS)
    if unknown:
        raise RegressError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_THRESHOLD_KEYS))})")
    changes: dict[str, Any] = {}
    for key, v in levels.items():
        if key == "direction":
            if v not in ("higher", "lower", "either"):
                raise RegressError(f"{where}: direction must be higher, lower or either, got {v!r}")
            changes[key] = v
        elif key == "enabled":
            if not isinstance(v, bool):
                raise RegressError(f"{where}: enabled must be true or false, got {v!r}")
            changes[key] = v
        else:
            changes[key] = _number(where, key, v, float, minimum=0)
    # an override of the absolute levels alone replaces the family's relative ones, and vice versa
    if {"warn", "fail"} & set(changes) and not {"warn_rel", "fail_rel"} & set(changes):
        changes.update(warn_rel=0.0, fail_rel=0.0)
    if {"warn_rel", "fail_rel"} & set(changes) and not {"warn", "fail"} & set(changes):
        changes.update(warn=0.0, fail=0.0)
    result = dataclasses.replace(default, **changes)
    if result.enabled and result.level("fail", 1.0) < result.level("warn", 1.0):
        raise RegressError(f"{where}: the fail level is below the warn level")
    return result
