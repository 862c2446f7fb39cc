"""The regression result as a terminal table, Markdown for a pull-request comment, JUnit XML, JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any
from xml.etree import ElementTree as ET

from rich.markup import escape
from rich.table import Table

from tracedag.pipeline.regress.model import STATUS_ORDER, MetricResult, RegressResult

_MARK = {"fail": "FAIL", "warn": "warn", "absent": "absent", "insufficient": "too few", "improved": "better",
         "ok": "ok"}
_STYLE = {"fail": "bold red", "warn": "yellow", "absent": "yellow", "insufficient": "yellow", "improved": "green"}
_CORRECTION = {"bh": "Benjamini-Hochberg", "holm": "Holm", "none": "unadjusted"}
_ARROW = {"higher": "higher is better", "lower": "lower is better", "either": "any change"}


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 and value != 0 else f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _signed(value: float | None) -> str:
    text = _num(value)
    return text if text == "-" or text.startswith("-") else "+" + text


def _ci(m: MetricResult) -> str:
    return "-" if m.ci_low is None else f"[{_signed(m.ci_low)}, {_signed(m.ci_high)}]"


def _p(m: MetricResult) -> str:
    return "-" if m.p_adjusted is None else (f"{m.p_adjusted:.3f}" if m.p_adjusted >= 0.001 else "<0.001")


def _levels(m: MetricResult) -> str:
    return f"{_num(m.warn_at)} / {_num(m.fail_at)}"


def ordered(result: RegressResult) -> list[MetricResult]:
    """Alerts first (fail, warn, absent, too few), then improvements, then the rest, stably."""
    return sorted(result.metrics, key=lambda m: STATUS_ORDER[m.status])


def verdict(result: RegressResult) -> str:
    """One line: what the gate decided and why."""
    fails, warns = result.alerts("fail"), result.alerts("warn")
    outcome = "FAIL" if result.exit_code else "PASS"
    why = f"{len(fails)} fail-level, {len(warns)} warn-level alert(s)"
    strict = " (--strict: warnings fail)" if result.strict and warns else ""
    return f"{outcome}: {why}{strict} over {len(result.metrics)} metrics"


def header_lines(result: RegressResult) -> list[str]:
    """Sides, pairing, unpaired cases, resampling."""
    b, c = result.baseline, result.candidate
    lines = [
        f"baseline  {b.selector}: {b.traces} traces in {b.cases} cases",
        f"candidate {c.selector}: {c.traces} traces in {c.cases} cases",
        f"paired by {', '.join(result.pair_by)}: {result.paired_cases} cases, {result.paired_scenarios} scenarios "
        f"for determinism; paired bootstrap {result.resamples} resamples, {result.confidence:.0%} CI, seed {result.seed}; "
        f"alert: effect beyond its level and p (adjusted over all metrics, {_CORRECTION[result.correction]}) "
        f"< {1 - result.confidence:.2g}",
    ]
    for side, cases in result.unpaired.items():
        if cases:
            shown = ", ".join(cases[:5]) + (f" (+{len(cases) - 5} more)" if len(cases) > 5 else "")
            lines.append(f"unpaired {side} cases ({len(cases)}, not compared): {shown}")
    lines += result.notes
    return lines


def rich_table(result: RegressResult, all_rows: bool = True) -> Table:
    """The terminal table, alerts first."""
    table = Table(title="tracedag regress: candidate - baseline per metric", title_justify="left")
    for name, justify in (("status", "left"), ("metric", "left"), ("n", "right"), ("baseline", "right"),
                          ("candidate", "right"), ("delta", "right"), ("CI", "right"), ("p adj", "right"),
                          ("warn / fail at", "right"),
                          ("note", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for m in ordered(result):
        if not all_rows and m.status == "ok":
            continue
        table.add_row(_MARK[m.status], escape(m.metric), str(m.pairs), _num(m.baseline_mean), _num(m.candidate_mean),
                      _signed(m.delta), _ci(m), _p(m), _levels(m), escape(m.note or _ARROW[m.direction]),
                      style=_STYLE.get(m.status))
    return table


def _md_row(m: MetricResult) -> str:
    cells = [f"**{_MARK[m.status]}**" if m.status == "fail" else _MARK[m.status], f"`{m.metric}`", str(m.pairs),
             _num(m.baseline_mean), _num(m.candidate_mean), _signed(m.delta), _ci(m), _p(m), _levels(m),
             m.note or _ARROW[m.direction]]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def markdown(result: RegressResult) -> str:
    """A pull-request comment: verdict, sides, the alerts, and every metric folded away."""
    head = "| status | metric | n | baseline | candidate | delta | CI | p adj | warn / fail at | note |\n" \
           "|---|---|--:|--:|--:|--:|--:|--:|--:|---|"
    alerts = [m for m in ordered(result) if m.status not in ("ok", "improved")]
    lines = [f"### tracedag regress: {verdict(result)}", ""]
    lines += [f"- {line}" for line in header_lines(result)]
    lines += ["", "An alert needs the effect beyond its level **and** a significant difference (adjusted p).", ""]
    if alerts:
        lines += [head, *(_md_row(m) for m in alerts), ""]
    else:
        lines += ["No metric regressed.", ""]
    lines += ["<details><summary>All metrics</summary>", "", head, *(_md_row(m) for m in ordered(result)), "",
              "</details>", ""]
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def to_json(result: RegressResult) -> str:
    """Every field, metrics in alert order, plus the verdict and exit code."""
    doc = asdict(result)
    doc["metrics"] = [{k: _clean(v) for k, v in asdict(m).items()} for m in ordered(result)]
    doc["verdict"] = verdict(result)
    doc["exit_code"] = result.exit_code
    return json.dumps(doc, indent=1) + "\n"


def junit(result: RegressResult) -> str:
    """JUnit XML: one test case per metric (classname = family, name = the breakdown, e.g. ``type=tool``)."""
    suite = ET.Element("testsuite", name="tracedag.regress", tests=str(len(result.metrics)))
    failures = skipped = 0
    for m in result.metrics:
        case = ET.SubElement(suite, "testcase", classname=f"tracedag.regress.{m.family}", name=m.breakdown or m.family)
        text = (f"{m.metric}: baseline {_num(m.baseline_mean)}, candidate {_num(m.candidate_mean)}, delta "
                f"{_signed(m.delta)}, CI {_ci(m)}, p adj {_p(m)}, n {m.pairs}, warn/fail at {_levels(m)} ({_ARROW[m.direction]})"
                + (f"; {m.note}" if m.note else ""))
        failing = m.status == "fail" or (result.strict and m.status in ("warn", "absent", "insufficient"))
        if failing:
            failures += 1
            ET.SubElement(case, "failure", message=f"{m.status}: {m.metric}", type=m.status).text = text
        elif m.status in ("absent", "insufficient"):
            skipped += 1
            ET.SubElement(case, "skipped", message=f"{m.status}: {m.note}")
        else:
            ET.SubElement(case, "system-out").text = f"{m.status}: {text}"
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
