"""Derived tables: evaluations, traces, dag_nodes, dag_edges, step_scores, human_labels, validations.

Each is a versioned Arrow schema whose Parquet files carry ``tracedag.schema`` in their metadata.
``traces``, ``dag_nodes`` and ``dag_edges`` rows carry the ``build_id`` of the build that wrote
them; the views keep only the latest build of each trace.
"""

from __future__ import annotations

import pyarrow as pa

from tracedag.schemas.spans import SCHEMA_KEY

_S = pa.string()
_DICT = pa.dictionary(pa.int32(), pa.string())


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={SCHEMA_KEY: name.encode()})


# One row per evaluation result carried in the spans (normalization extracts them at ingest).
EVALUATIONS_V1 = _schema(
    "evaluations/v1",
    [
        pa.field("trace_id", _S, nullable=False),
        pa.field("span_id", _S),  # the evaluated span (target); null when it could not be matched
        pa.field("source_span_id", _S),  # the span that carried the result (event owner / evaluator)
        pa.field("source_kind", _S),  # gen_ai.evaluation.result | openinference.annotation | ...
        pa.field("name", _S),  # metric name
        pa.field("score_value", pa.float64()),
        pa.field("label", _S),
        pa.field("explanation", _S),
        pa.field("evaluator", _S),
        pa.field("response_id", _S),
        pa.field("time_unix_nano", pa.int64()),
        pa.field("received_unix_nano", pa.int64()),
        pa.field("batch_id", _S),
    ],
)

TRACES_V1 = _schema(
    "traces/v1",
    [
        pa.field("trace_id", _S, nullable=False),
        pa.field("build_id", _S, nullable=False),
        pa.field("built_unix_nano", pa.int64(), nullable=False),
        pa.field("last_received_unix_nano", pa.int64()),
        pa.field("root_span_id", _S),
        pa.field("service_name", _S),
        pa.field("service_version", _S),
        pa.field("conversation_id", _S),
        pa.field("run_id", _S),
        pa.field("scenario_id", _S),
        pa.field("replay_index", pa.int64()),
        pa.field("variant_id", _S),
        pa.field("start_time_unix_nano", pa.int64()),
        pa.field("end_time_unix_nano", pa.int64()),
        pa.field("duration_ns", pa.int64()),
        pa.field("span_count", pa.int32()),
        pa.field("error_count", pa.int32()),
        pa.field("root_count", pa.int32()),
        pa.field("orphan_count", pa.int32()),
        pa.field("clock_skew_count", pa.int32()),
        pa.field("connected", pa.bool_()),
        pa.field("method", _S),  # explicit | inferred | flat
        pa.field("fallback_reason", _S),
        pa.field("deviant", pa.bool_()),
        pa.field("deviation_reason", _S),
    ],
)

DAG_NODES_V1 = _schema(
    "dag_nodes/v1",
    [
        pa.field("trace_id", _S, nullable=False),
        pa.field("span_id", _S, nullable=False),
        pa.field("build_id", _S, nullable=False),
        pa.field("parent_span_id", _S),  # call-tree parent after repair (orphans re-attached)
        pa.field("step_type", _DICT),
        pa.field("step_name", _S),
        pa.field("step_key", _S),  # logical step used for loop unrolling
        pa.field("iteration", pa.int32()),  # 1..k among executions of the same step key
        pa.field("is_retry", pa.bool_()),  # the previous iteration failed
        pa.field("branch_id", pa.int32()),
        pa.field("depth", pa.int32()),
        pa.field("topo_index", pa.int32()),
        pa.field("nested_left", pa.int32()),
        pa.field("nested_right", pa.int32()),
        pa.field("is_orphan", pa.bool_()),
        pa.field("clock_skew", pa.bool_()),
        pa.field("start_time_unix_nano", pa.int64()),
        pa.field("end_time_unix_nano", pa.int64()),
        pa.field("duration_ns", pa.int64()),
        pa.field("status_code", pa.int8()),
        pa.field("spec_node", _S),
        pa.field("step_role", _S),  # AgentEval role: PLAN | TOOLSEL | PARAMGEN | EXEC | SYNTH (null: none)
    ],
)

DAG_EDGES_V1 = _schema(
    "dag_edges/v1",
    [
        pa.field("trace_id", _S, nullable=False),
        pa.field("build_id", _S, nullable=False),
        pa.field("src_span_id", _S, nullable=False),
        pa.field("dst_span_id", _S, nullable=False),
        pa.field("edge_kind", _S),  # parent | sequence | explicit | orphan_attach | tool_call | data
        # dependency direction used for propagation: upstream influences downstream
        # (earlier sibling -> later sibling, child -> parent)
        pa.field("upstream_span_id", _S),
        pa.field("downstream_span_id", _S),
        # data edges only (null on the others): the producer's trace (an earlier turn's, or trace_id),
        # the consumer's argument whose value the producer wrote, and where: output | user
        pa.field("src_trace_id", _S),
        pa.field("data_arg", _S),
        pa.field("data_from", _S),
    ],
)

STEP_SCORES_V1 = _schema(
    "step_scores/v1",
    [
        pa.field("trace_id", _S, nullable=False),
        pa.field("span_id", _S, nullable=False),
        pa.field("build_id", _S),
        pa.field("metric", _S, nullable=False),
        pa.field("score", pa.float64()),  # 1..5, <= 2 means failed
        pa.field("label", _S),
        pa.field("source", _S),  # rule | evaluation | judge | human
        pa.field("rule_name", _S),
        pa.field("judge_model", _S),
        pa.field("rubric_version", _S),
        pa.field("explanation", _S),
        pa.field("taxonomy_l1", _S),
        pa.field("taxonomy_l2", _S),
        pa.field("taxonomy_l3", _S),
        pa.field("scored_unix_nano", pa.int64()),
    ],
)

HUMAN_LABELS_V1 = _schema(
    "human_labels/v1",
    [
        pa.field("trace_id", _S, nullable=False),
        pa.field("span_id", _S, nullable=False),
        pa.field("metric", _S),
        pa.field("score", pa.float64()),
        pa.field("label", _S),
        pa.field("taxonomy_l3", _S),
        pa.field("annotator", _S),
        pa.field("note", _S),
        pa.field("imported_unix_nano", pa.int64()),
    ],
)


# One row per run checked by `tracedag validate check` against a validation model (DESIGN.md §10).
VALIDATIONS_V1 = _schema(
    "validations/v1",
    [
        pa.field("run_key", _S, nullable=False),
        pa.field("agent", _S),
        pa.field("agent_version", _S),
        pa.field("scenario", _S),
        pa.field("trace_ids", pa.list_(_S)),
        pa.field("passed", pa.bool_()),  # null: the model has no skeleton for the scenario
        pa.field("coverage", pa.float64()),
        pa.field("essential_states", pa.int32()),
        pa.field("matched_states", pa.int32()),
        pa.field("missing", pa.list_(_S)),
        pa.field("out_of_order", pa.list_(pa.struct([("expected_first", _S), ("expected_second", _S)]))),
        pa.field("explanation", _S),
        pa.field("too_slow", pa.list_(_S)),
        pa.field("failure_paths", pa.list_(_S)),
        pa.field("run_failed", pa.bool_()),
        pa.field("model", _S),
        pa.field("state", _S),
        pa.field("start_time_unix_nano", pa.int64()),
        pa.field("checked_unix_nano", pa.int64()),
    ],
)


# One row per root cause checked by `tracedag confirm` (counterfactual replay, DESIGN.md §8): the
# failed conversation re-run N times with only the root-cause step's output replaced.
ROOT_CAUSE_CHECKS_V1 = _schema(
    "root_cause_checks/v1",
    [
        pa.field("conversation_id", _S, nullable=False),
        pa.field("trace_id", _S),  # the trace of the conversation's final failure
        pa.field("root_trace_id", _S),
        pa.field("root_span_id", _S),
        pa.field("root_step_name", _S),
        pa.field("root_step_type", _S),
        pa.field("failed_step_name", _S),  # the final failure whose disappearance is looked for
        pa.field("strategy", _S),
        pa.field("replacement_kind", _S),  # recorded_tool | paramgen | file | gold_step | null: none found
        pa.field("replacement_source", _S),  # where the replacement came from (conversation/span, file path)
        pa.field("runs", pa.int32()),  # runs that ran to their end
        pa.field("failures_after", pa.int32()),  # of those, runs where the final failure came back
        pa.field("verdict", _S),  # confirmed | refuted | inconclusive
        pa.field("reason", _S),
        pa.field("downstream_failures_before", pa.int32()),  # failed steps after the root in the source
        pa.field("downstream_failures_after", pa.float64()),  # mean over the runs
        pa.field("agent", _S),
        pa.field("replay_id", _S),
        pa.field("checked_unix_nano", pa.int64()),
    ],
)

# v2 (a check's score deltas and the model output served): v1's columns, then the new ones, so a v1 file
# reads by name with nulls in them (store.views reads this table by name).
ROOT_CAUSE_CHECKS_V2 = _schema(
    "root_cause_checks/v2",
    [
        *ROOT_CAUSE_CHECKS_V1,
        pa.field("replacement_output", _S),  # a model step's served output (gold_step, judge); null for tools
        pa.field("runs_improved", pa.int32()),  # counted runs whose downstream step scores rose by score_threshold
        pa.field("downstream_score_before", pa.float64()),  # mean score of the source's steps after the root
        pa.field("downstream_score_after", pa.float64()),  # mean over the scored runs of the same steps' mean
        pa.field("downstream_score_delta", pa.float64()),  # after - before
        pa.field("score_threshold", pa.float64()),  # the rise that counts as improved (AgentEval's step_score level)
    ],
)
