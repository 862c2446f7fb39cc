"""Judge rubrics (``schemas/rubrics/<step_type>.<metric>.yaml``) and the prompt built from them.

The judge sees the step (type, name, tool, status), its inputs, its output and the outputs of
the steps upstream of it in the DAG; never any score of those upstream steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from tracedag.pipeline.score.taxonomy import UNCLASSIFIED, load_taxonomy


@dataclass(frozen=True)
class Rubric:
    """One rubric: a step type, a metric, anchors 1-5 and calibration examples."""

    id: str
    version: str
    step_type: str
    metric: str
    question: str
    anchors: dict[int, str]
    failure_categories: tuple[str, ...]
    examples: tuple[dict[str, Any], ...]

    @property
    def tag(self) -> str:
        """The value stored in ``rubric_version``: ``<id>@<version>``."""
        return f"{self.id}@{self.version}"


def _parse(doc: dict[str, Any]) -> Rubric:
    anchors = {int(k): str(v) for k, v in doc["anchors"].items()}
    if sorted(anchors) != [1, 2, 3, 4, 5]:
        raise ValueError(f"rubric {doc.get('id')}: anchors must be exactly 1..5")
    leaves = load_taxonomy().leaves
    unknown = [c for c in doc["failure_categories"] if c not in leaves]
    if unknown:
        raise ValueError(f"rubric {doc['id']}: unknown taxonomy categories {unknown}")
    return Rubric(
        id=doc["id"], version=str(doc["version"]), step_type=doc["step_type"], metric=doc["metric"],
        question=" ".join(str(doc["question"]).split()), anchors=anchors,
        failure_categories=tuple(doc["failure_categories"]), examples=tuple(doc.get("examples") or ()),
    )


def load_rubrics(directory: Path | None = None) -> dict[str, list[Rubric]]:
    """Return the rubrics by step type, from ``directory`` or the bundled ``schemas/rubrics``."""
    if directory is None:
        return _bundled()
    return _group([_parse(yaml.safe_load(p.read_text(encoding="utf-8"))) for p in sorted(directory.glob("*.yaml"))])


@lru_cache(maxsize=1)
def _bundled() -> dict[str, list[Rubric]]:
    root = files("tracedag.schemas").joinpath("rubrics")
    docs = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in root.iterdir() if p.name.endswith(".yaml")]
    return _group([_parse(d) for d in sorted(docs, key=lambda d: str(d["id"]))])


def _group(rubrics: list[Rubric]) -> dict[str, list[Rubric]]:
    out: dict[str, list[Rubric]] = {}
    for r in rubrics:
        out.setdefault(r.step_type, []).append(r)
    return out


@dataclass(frozen=True)
class JudgeInput:
    """What the judge is shown about one step."""

    step_type: str
    step_name: str
    tool_name: str | None
    status: str
    input_text: str
    output_text: str
    upstream: tuple[tuple[str, str], ...]  # (upstream step label, its output), never its score


def _examples_text(rubric: Rubric) -> str:
    parts = []
    for i, ex in enumerate(rubric.examples, 1):
        answer = {"score": ex["score"], "taxonomy_l3": ex.get("taxonomy_l3"), "explanation": ex["explanation"]}
        parts.append(f"Example {i}\nINPUT: {ex['input']}\nUPSTREAM: {ex.get('upstream') or '(none)'}\n"
                     f"OUTPUT: {ex['output']}\nANSWER: {json.dumps(answer, ensure_ascii=False)}")
    return "\n\n".join(parts)


def system_prompt(rubric: Rubric) -> str:
    """The judge's instructions for one rubric: question, anchors, categories, examples, answer format."""
    anchors = "\n".join(f"{k}: {rubric.anchors[k]}" for k in range(5, 0, -1))
    cats = load_taxonomy().leaves
    cat_lines = "\n".join(f"- {c}: {cats[c].definition}" for c in rubric.failure_categories)
    return (
        f"You grade one step of an AI agent's execution on the metric '{rubric.metric}'.\n"
        f"Question: {rubric.question}\n\nScore 1-5 with these anchors:\n{anchors}\n\n"
        f"When the score is 1 or 2, name the failure category (taxonomy_l3), one of:\n{cat_lines}\n"
        f"or '{UNCLASSIFIED}' if none fits. For scores 3-5 set taxonomy_l3 to null.\n\n"
        f"Calibration examples:\n\n{_examples_text(rubric)}\n\n"
        'Answer with ONE JSON object and nothing else: {"score": <integer 1-5>, '
        '"taxonomy_l3": <category or null>, "explanation": "<one or two sentences>"}'
    )


def user_prompt(step: JudgeInput) -> str:
    """The step shown to the judge: its identity, inputs, upstream outputs and output."""
    upstream = "\n".join(f"- {label}: {text}" for label, text in step.upstream) or "(none)"
    tool = f"\nTool: {step.tool_name}" if step.tool_name else ""
    return (
        f"Step type: {step.step_type}\nStep name: {step.step_name}{tool}\nStatus: {step.status}\n\n"
        f"INPUT:\n{step.input_text or '(not recorded)'}\n\nUPSTREAM OUTPUTS:\n{upstream}\n\n"
        f"OUTPUT:\n{step.output_text or '(not recorded)'}"
    )
