"""The rule pass over a whole scan at once, with the same rows as ``rules.table.score_step`` step by step.

- Quiet steps (``scan.Scan``: the ``quiet`` flag, or a calm tool step whose result neither
  reports an error nor is empty, whose arguments parse and whose tool has no schema in the
  trace) cannot make a rule fire: their passing rows (one per
  base metric of the step type, ``rules.table.BASE_METRICS``) are built column-wise.
- The others go through ``rules.table.score_step``, once per distinct set of facts: steps that differ
  only in their keys, or in tool arguments that cannot matter (no schema, and they parse), get
  the same rows. Failures repeat (the same timeout of the same tool), so this runs the rule table
  a few times per distinct error instead of once per failing step.

``pipeline/score/reference.py`` keeps the plain per-step loop; tests/score/test_columnar.py
checks that both write the same rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.score.inputs import Definitions, facts_from_row, step_tool, tool_schema
from tracedag.pipeline.score.rows import ScoreRow, passing_table, to_table
from tracedag.pipeline.score.rules.table import (
    BASE_METRICS,
    DEFAULT_METRICS,
    PASS_EXPLANATION,
    PASS_RULE,
    PASS_SCORE,
    StepFacts,
    score_step,
    tool_output_empty,
    tool_result_reports_error,
)
from tracedag.pipeline.score.rules.toolschema import arguments_are_json, arguments_are_json_all
from tracedag.pipeline.score.scan import Scan

KEY_COLUMNS = ["trace_id", "span_id", "build_id"]


def quiet_mask(scan: Scan) -> np.ndarray:
    """True for the steps no rule can fire on."""
    out: np.ndarray = quiet_non_tools(scan) | quiet_tools(scan)
    return out


def quiet_non_tools(scan: Scan) -> np.ndarray:
    """The quiet steps SQL could tell (the ``quiet`` flag: no tool step)."""
    return _true(scan.facts.column("quiet"))


def quiet_tools(scan: Scan) -> np.ndarray:
    """The quiet tool steps: calm, a quiet result, arguments that parse, no schema for the tool."""
    calm = _true(scan.facts.column("tool_calm"))
    quiet = np.zeros(len(calm), dtype=bool)
    if calm.any():
        quiet[np.flatnonzero(calm)[_tools_quiet(scan.facts, calm, scan.defs)]] = True
    return quiet


def _true(column: pa.ChunkedArray) -> np.ndarray:
    out: np.ndarray = pc.fill_null(column, False).to_numpy(zero_copy_only=False).copy()
    return out


def _tools_quiet(facts: pa.Table, calm: np.ndarray, defs: Definitions) -> np.ndarray:
    """For the calm tool steps: a quiet result, arguments that parse and no schema for the tool."""
    mask = pa.array(calm)
    ok = np.array(arguments_are_json_all(facts.column("tool_args").filter(mask).to_pylist()), dtype=bool)
    ok &= _results_quiet(facts, calm)
    if defs:
        ok &= ~_has_schema(facts.select(["trace_id", "tool_name", "step_name"]).filter(mask), defs)
    return ok


def _results_quiet(facts: pa.Table, calm: np.ndarray) -> np.ndarray:
    """For the calm tool steps: a result that neither reports an error nor is empty.

    ``tool_quiet`` says so where SQL could tell; the rules' own checks decide the others.
    """
    ok = _true(facts.column("tool_quiet"))
    todo = calm & ~ok
    texts = facts.column("result_text").filter(pa.array(todo)).to_pylist()
    for i, text in zip(np.flatnonzero(todo), texts, strict=True):
        f = StepFacts("", "", step_type="tool", output_text=text)
        ok[i] = not tool_result_reports_error(f) and not tool_output_empty(f)
    out: np.ndarray = ok[calm]
    return out


def _has_schema(tools: pa.Table, defs: Definitions) -> np.ndarray:
    """Whether each tool step's tool has a schema in its trace."""
    cols = [tools.column(c).to_pylist() for c in ("trace_id", "tool_name", "step_name")]
    found = (tool_schema(defs, trace, step_tool(tool, name, "tool")) is not None
             for trace, tool, name in zip(*cols, strict=True))
    return np.fromiter(found, dtype=bool, count=tools.num_rows)


def quiet_keys(facts: pa.Table, quiet: np.ndarray) -> pa.Table:
    """(trace_id, span_id, build_id, metric) of the passing rows of the quiet steps: one per base
    metric of the step type (``rules.table.metrics_for``; no quiet step has a tool schema)."""
    codes, base = _base_metrics(facts)
    keys = facts.select(KEY_COLUMNS)
    parts = []
    for metric in dict.fromkeys(m for metrics in [DEFAULT_METRICS, *BASE_METRICS.values()] for m in metrics):
        has = np.array([metric in metrics for metrics in base], dtype=bool)
        part = keys.filter(pa.array(quiet & has[codes]))
        parts.append(part.append_column("metric", pa.repeat(pa.scalar(metric), part.num_rows)))
    return pa.concat_tables(parts)


def passing_rows(facts: pa.Table, quiet: np.ndarray) -> pa.Table:
    """``STEP_SCORES_V1`` rows of the quiet steps: "no rule fired" on each base metric."""
    return passing_table(quiet_keys(facts, quiet), PASS_RULE, PASS_EXPLANATION, PASS_SCORE)


def passing_count(facts: pa.Table, quiet: np.ndarray) -> int:
    """How many rows ``passing_rows`` makes."""
    codes, base = _base_metrics(facts)
    return int(np.array([len(metrics) for metrics in base], dtype=np.int64)[codes[quiet]].sum())


def _base_metrics(facts: pa.Table) -> tuple[np.ndarray, list[tuple[str, ...]]]:
    """Each step's step-type code, and the base metrics of each code."""
    types = pc.dictionary_encode(facts.column("step_type"), null_encoding="encode").combine_chunks()
    base = [BASE_METRICS.get(t or "", DEFAULT_METRICS) for t in types.dictionary.to_pylist()]
    return types.indices.to_numpy(), base


def step_rows(facts: pa.Table, defs: Definitions, max_iterations: int | None) -> pa.Table:
    """``STEP_SCORES_V1`` rows of ``score_step`` on every step of ``facts``, run once per distinct signature."""
    signatures: dict[tuple[object, ...], int] = {}
    templates: list[list[ScoreRow]] = []
    members = np.zeros(facts.num_rows, dtype=np.int64)
    for i, r in enumerate(r for batch in facts.to_batches(50_000) for r in batch.to_pylist()):
        f = facts_from_row(r, defs, max_iterations)
        key = signature(f)
        if key not in signatures:
            signatures[key] = len(templates)
            templates.append(score_step(f))
        members[i] = signatures[key]
    return _expand(facts.select(KEY_COLUMNS), templates, members)


def _expand(keys: pa.Table, templates: list[list[ScoreRow]], members: np.ndarray) -> pa.Table:
    """Each step's rows: the rows of its signature (``members``: an index into ``templates``) with its keys."""
    sizes = np.array([len(t) for t in templates], dtype=np.int64)
    counts = sizes[members]
    ends = np.cumsum(counts)
    within = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - counts, counts)
    picks = np.repeat((np.cumsum(sizes) - sizes)[members], counts) + within
    table = to_table([r for t in templates for r in t]).take(pa.array(picks))
    step_keys = keys.take(pa.array(np.repeat(np.arange(keys.num_rows), counts)))
    for name in KEY_COLUMNS:
        i = table.schema.get_field_index(name)
        field = table.schema.field(i)
        table = table.set_column(i, field, step_keys.column(name).cast(field.type))
    return table


def signature(f: StepFacts) -> tuple[object, ...]:
    """Every fact ``score_step`` reads, bar the keys; arguments only where they can matter.

    A step's arguments (``tool_args``, ``input_text``) only feed ``rules.table.args_problem``, which is
    None for a non-tool step, and for a tool step without a schema whose arguments parse.
    """
    args_matter = f.step_type == "tool" and (f.tool_schema is not None or not arguments_are_json(f.tool_args))
    return (f.step_type, f.step_name, f.tool_name, f.iteration, f.status_code, f.status_message, f.error_type,
            f.finish_reason, f.output_text, f.output_tokens, f.http_status, f.task_status, tuple(f.exceptions),
            id(f.tool_schema), f.max_iterations, (f.tool_args, f.input_text) if args_matter else None)
