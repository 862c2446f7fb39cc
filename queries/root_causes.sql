-- root_causes: root-cause step of each failed trace, step or conversation (across its turns) by a chosen strategy.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores, spans,
--          read through the macros trace_window and failure_dag_roots of _failure_graph.sql;
--          root_cause_checks (tracedag confirm) for confirmed
-- Output:  trace_id, strategy, failed_span_id, failed_step_type, failed_step_name, failed_score,
--          recovered, kind, root_span_id, root_step_type, root_step_name, root_score,
--          root_taxonomy_l1, root_taxonomy_l2, root_taxonomy_l3, hops_from_root, longest_chain,
--          failed_steps_in_trace, conversation_id, start_time, turn_index, root_trace_id,
--          root_turn_index, root_cancelled, confirmed, silent_producer, data_arg
-- columns: root_step_name, root_step_type, root_taxonomy_l1, failed_step_name, hops_from_root, trace_id
-- Params:
--   $fail_threshold  double  = 2.0     a step fails when its score (the minimum over its step_scores rows) is <= this (scale 1..5)
--   $since_ns        bigint  = 0       only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''      only this trace ('' = every trace)
--   $strategy        varchar = greedy  one of greedy|full_path_min|weighted|agenteval
--   $per             varchar = trace   one of trace|step|conversation: one row per failed trace, per failed step, or per failed conversation
--   $max_hops        integer = 1000    bound on the recursions
--
-- Scores, recovered failures (a retry, or another route), cancelled steps and the failure DAG
-- (u -> v: v is the nearest failure downstream of the source u) are defined in propagation.sql.
-- For a failed step v:
--   greedy         start at v; repeatedly move to the lowest-scoring step among the failure-DAG
--                  predecessors of the current step (ties: see below) until the
--                  current step has none. hops_from_root = moves made.
--   full_path_min  the lowest-scoring step among all failures upstream of v in the failure DAG
--                  (ties: see below); v itself when none. hops_from_root = longest
--                  failure-DAG path from the root to v.
--   weighted       among the originating failures upstream of v (no failing upstream of their own),
--                  the one with the largest weight (5 - score) * (1 + number of failures downstream
--                  of it in the failure DAG): severity times blast radius (ties: see below);
--                  v itself when v is originating. hops_from_root as for full_path_min.
--   agenteval      AgentEval's rule: a failure propagates only from a failing DIRECT parent (a
--                  dependency edge from a source failure straight into it, never through a step
--                  that passed); its source is the lowest-scoring such parent (ties: see below),
--                  and its root the source's root, in topological order (walked
--                  like greedy). hops_from_root = moves made; kind is 'propagated' when v has such a parent.
-- Ties (every strategy): the earlier turn (per=conversation), then the deepest step in the call
-- tree (a wrapper starts before the step that failed under it, and is not its cause), then the
-- earliest start, then span_id.
-- hops_from_root measures the path from the chosen root; longest_chain is propagation.sql's
-- longest_chain of the failed step (the same value): the longest failure-DAG path from any
-- originating failure to it (0 when it is originating). The root need not start that chain (greedy moves to the lowest
-- score, not along the longest path; full_path_min may stop mid-chain), so for greedy,
-- full_path_min and weighted hops_from_root <= longest_chain, equal when the root starts it.
-- Cancelled steps only ever lead back to the failure that triggered the cancellation: they are
-- never a predecessor, so never the root of another failure, and never a trace's failure while a
-- failure that was not cancelled is left.
-- The failure of a trace is its final failure: the non-recovered failure with no failure downstream
-- of it (not a cancelled one when another is left) that has the most failures upstream (ties:
-- latest end, then span_id). A trace whose failures were all recovered is not a failed trace.
-- per=conversation: the traces sharing conversation_id (a trace without one is its own
-- conversation) are the turns of one conversation, in start order (turn_index 1, 2, ...); every
-- turn of a conversation with a trace in the window is read. Each turn's root span is upstream of
-- the steps of the next turn that have no upstream step in their own trace, so a failure in a later
-- turn can be caused by one in an earlier turn, except a failure of the environment (taxonomy
-- timeout, rate_limited, connection_error, content_filtered, or http_error on an llm step), which
-- no earlier turn causes. One row per failed conversation: its final failure (the latest turn's
-- first, then as above) with its root cause, which may lie in an earlier trace: root_trace_id and
-- root_turn_index say where. In the other modes turn_index and root_turn_index are the turn of the
-- trace in its conversation and root_trace_id = trace_id.
-- confirmed: the verdict of the latest counterfactual check of the root step (`tracedag confirm`):
-- confirmed | refuted | inconclusive, null when it was never checked.
-- Silent producers (value provenance): when the root chosen above is a failed step with data edges
-- (dag_edges edge_kind 'data', written at score time: an argument value of the step that appeared
-- verbatim earlier, in a step's output or a user message; per=conversation from any earlier turn, else
-- from the same trace) and its failure says the value is unknown, invalid or not found (its status
-- message, error type, output or rule explanation holds 404, "not found", "no such", "invalid", "does
-- not exist", "unrecognized", "no record", "unknown" but not "unknown error", or a validation message
-- naming the argument), the producer is the root cause although it passed: silent_producer true,
-- data_arg the argument (the one the message names first, then the earliest producer), root_* the
-- producer's step (root_score its lowest score, null when unscored; no taxonomy), hops_from_root one
-- more (the data edge). A value a user typed (data_from 'user') names the user: root_step_type and
-- root_step_name 'user', root_span_id the step that carried the user message (the turn's earliest
-- model call, else its root span), root_trace_id and root_turn_index that turn. Otherwise
-- silent_producer is false and data_arg null.
-- Recursion bounds: the downstream walk (reach) is a UNION over a finite set of (failure, step)
-- pairs, so it ends even on a cyclic edge set; the failure-DAG closure and the walks stop after
-- $max_hops hops.
with recursive
win as (
    select trace_id, conversation_id from trace_window($since_ns, $trace_id)
),
turns as materialized (
    -- the turn of every trace of the window's conversations (per=conversation reads them all)
    select trace_id, conversation_id, turn_index
    from conversation_turns((
        select list(trace_id) from traces
        where coalesce(conversation_id, trace_id) in (select coalesce(conversation_id, trace_id) from win)))
),
g as materialized (
    -- one call: within each trace, or (per=conversation) across the turns of whole conversations
    from failure_dag_roots($fail_threshold,
                           (select list(trace_id) from turns
                            where cast($per as varchar) = 'conversation' or trace_id in (select trace_id from win)),
                           $max_hops, cast($per as varchar) = 'conversation')
),
fail as (
    select * exclude (nearest, ancestors, greedy_root_id, greedy_hops, final) from g
),
fe as (
    -- the failure DAG: an edge up -> down
    select grp, unnest(nearest) as up, node as down from g
),
anc as (
    -- its closure: a fails upstream of v, dist = hops of the longest path from a to v
    select grp, node as v, unnest(ancestors, recursive := true) from g
),
greedy as (
    select grp, node, greedy_root_id as root_id, greedy_hops as hops from g
),
full_path_min as (
    select anc.grp, anc.v as node, anc.a as root_id, anc.dist as hops
    from anc join fail a on a.grp = anc.grp and a.node = anc.a
    qualify row_number() over (
        partition by anc.grp, anc.v
        order by a.score, a.turn_index nulls first, a.depth desc nulls last, a.start_time_unix_nano, anc.a) = 1
),
blast as (
    select grp, a as node, count(*) as downstream_failures
    from anc group by all
),
weighted as (
    select anc.grp, anc.v as node, anc.a as root_id, anc.dist as hops
    from anc
    join fail a on a.grp = anc.grp and a.node = anc.a
    join blast b on b.grp = anc.grp and b.node = anc.a
    where not exists (select 1 from fe where fe.grp = anc.grp and fe.down = anc.a)
    qualify row_number() over (
        partition by anc.grp, anc.v
        order by (5.0 - a.score) * (1 + b.downstream_failures) desc, a.turn_index nulls first,
                 a.depth desc nulls last, a.start_time_unix_nano, anc.a) = 1
),
direct_next as materialized (
    -- AgentEval: the source of each failure with a failing direct parent (ties as greedy's, a null
    -- sorting after every value in the key)
    select d.grp, d.down as v,
           arg_min(d.up, (u.score, u.turn_index is not null, u.turn_index, -u.depth, u.start_time_unix_nano, d.up)) as nxt
    from (select grp, node as down, unnest(direct) as up from g where cast($strategy as varchar) = 'agenteval') d
    join fail u on u.grp = d.grp and u.node = d.up
    group by d.grp, d.down
),
direct_walk(grp, start_id, cur, hops) as (
    select grp, node, node, 0 from fail where cast($strategy as varchar) = 'agenteval'
    union all
    select w.grp, w.start_id, n.nxt, w.hops + 1
    from direct_walk w join direct_next n on n.grp = w.grp and n.v = w.cur
    where w.hops < cast($max_hops as integer)
),
agenteval as (
    select grp, start_id as node, cur as root_id, hops
    from direct_walk
    qualify row_number() over (partition by grp, start_id order by hops desc) = 1
),
chosen as (
    select * from greedy where cast($strategy as varchar) = 'greedy'
    union all
    select * from full_path_min where cast($strategy as varchar) = 'full_path_min'
    union all
    select * from weighted where cast($strategy as varchar) = 'weighted'
    union all
    select * from agenteval where cast($strategy as varchar) = 'agenteval'
),
upstream_count as (
    select grp, v as node, count(*) as n, max(dist) as longest from anc group by all
),
final as (
    select grp, node from g where final
),
checked as (
    select root_trace_id, root_span_id, arg_max(verdict, checked_unix_nano) as verdict
    from root_cause_checks group by all
),
per_trace as (
    select trace_id, count(*) as failed_steps from fail group by all
),
data_in as (
    -- value provenance: the data edges into failed steps (per=conversation from any turn of the
    -- conversation, else from the same trace), with the producer's step
    select e.trace_id, e.dst_span_id, coalesce(e.src_trace_id, e.trace_id) as src_trace_id, e.src_span_id,
           e.data_arg, e.data_from, p.step_type, p.step_name, p.start_time_unix_nano as src_start
    from dag_edges e
    join dag_nodes p on p.trace_id = coalesce(e.src_trace_id, e.trace_id) and p.span_id = e.src_span_id
    where e.edge_kind = 'data' and e.trace_id in (select trace_id from fail)
      and (cast($per as varchar) = 'conversation' or coalesce(e.src_trace_id, e.trace_id) = e.trace_id)
),
data_text as (
    -- what the consumer's failure says (status message, error type, output, rule explanation), lower case
    select s.trace_id, s.span_id,
           lower(concat_ws(' ', any_value(s.status_message), any_value(s.error_type), any_value(s.output_text),
                           any_value(f.explanation))) as txt
    from spans s
    semi join data_in d on d.trace_id = s.trace_id and d.dst_span_id = s.span_id
    join fail f on f.trace_id = s.trace_id and f.span_id = s.span_id
    where s.trace_id in (select trace_id from data_in)
    group by all
),
silent as (
    -- a failure that says its value is unknown, invalid or not found (or a validation error naming the
    -- argument): the producer of that value is the root cause, even though it passed (silent_producer)
    select d.*, regexp_extract(lower(d.data_arg), '([a-z0-9_]+)[^a-z0-9_]*$', 1) as arg_leaf
    from data_in d
    join data_text x on x.trace_id = d.trace_id and x.span_id = d.dst_span_id
    where regexp_matches(x.txt, '(^|[^a-z0-9])(404|not found|not_found|notfound|no such|invalid|does not exist|doesn''t exist|do not exist|nonexistent|non-existent|not recognized|unrecognized|no record|no matching)([^a-z0-9]|$)')
       or (regexp_matches(x.txt, '(^|[^a-z0-9])unknown([^a-z0-9]|$)')
           and not regexp_matches(x.txt, 'unknown (error|exception|failure|issue|problem)'))
       or (regexp_matches(x.txt, 'validation|must be|should be|is required|input should|expected')
           and contains(x.txt, regexp_extract(lower(d.data_arg), '([a-z0-9_]+)[^a-z0-9_]*$', 1)))
    qualify row_number() over (
        partition by d.trace_id, d.dst_span_id
        order by contains(x.txt, regexp_extract(lower(d.data_arg), '([a-z0-9_]+)[^a-z0-9_]*$', 1)) desc,
                 d.src_start, d.data_arg, d.src_span_id) = 1
),
producer_score as (
    select s.trace_id, s.span_id, min(cast(s.score as double)) as score
    from step_scores s semi join silent p on p.src_trace_id = s.trace_id and p.src_span_id = s.span_id
    group by all
)
select f.trace_id, cast($strategy as varchar) as strategy,
       f.span_id as failed_span_id, f.step_type as failed_step_type, f.step_name as failed_step_name,
       f.score as failed_score, f.recovered,
       case when cast($strategy as varchar) = 'agenteval'
            then case when len(f.direct) = 0 then 'originating' else 'propagated' end
            when c.node is null then 'originating' else 'propagated' end as kind,
       coalesce(sp.src_span_id, r.span_id) as root_span_id,
       case when sp.data_from = 'user' then 'user' when sp.src_span_id is not null then sp.step_type
            else r.step_type end as root_step_type,
       case when sp.data_from = 'user' then 'user' when sp.src_span_id is not null then sp.step_name
            else r.step_name end as root_step_name,
       case when sp.src_span_id is not null then ps.score else r.score end as root_score,
       case when sp.src_span_id is null then r.taxonomy_l1 end as root_taxonomy_l1,
       case when sp.src_span_id is null then r.taxonomy_l2 end as root_taxonomy_l2,
       case when sp.src_span_id is null then r.taxonomy_l3 end as root_taxonomy_l3,
       coalesce(ch.hops, 0) + (sp.src_span_id is not null)::int as hops_from_root,
       coalesce(c.longest, 0) as longest_chain,
       p.failed_steps as failed_steps_in_trace, tf.conversation_id,
       make_timestamp(f.start_time_unix_nano // 1000) as start_time,
       tf.turn_index, coalesce(sp.src_trace_id, r.trace_id) as root_trace_id,
       coalesce(tp.turn_index, tr.turn_index) as root_turn_index,
       sp.src_span_id is null and r.cancelled as root_cancelled,
       k.verdict as confirmed,
       sp.src_span_id is not null as silent_producer, sp.data_arg as data_arg
from fail f
join turns tf on tf.trace_id = f.trace_id
join per_trace p on p.trace_id = f.trace_id
left join upstream_count c on c.grp = f.grp and c.node = f.node
left join chosen ch on ch.grp = f.grp and ch.node = f.node
join fail r on r.grp = f.grp and r.node = coalesce(ch.root_id, f.node)
join turns tr on tr.trace_id = r.trace_id
left join silent sp on sp.trace_id = r.trace_id and sp.dst_span_id = r.span_id
left join turns tp on tp.trace_id = sp.src_trace_id
left join producer_score ps on ps.trace_id = sp.src_trace_id and ps.span_id = sp.src_span_id
left join checked k on k.root_trace_id = coalesce(sp.src_trace_id, r.trace_id)
                   and k.root_span_id = coalesce(sp.src_span_id, r.span_id)
where (case when cast($strategy as varchar) in ('greedy', 'full_path_min', 'weighted', 'agenteval')
             and cast($per as varchar) in ('trace', 'step', 'conversation') then true
            else error('strategy must be greedy|full_path_min|weighted|agenteval and per trace|step|conversation') end)
  and (cast($per as varchar) = 'step'
       or exists (select 1 from final x where x.grp = f.grp and x.node = f.node))
order by f.trace_id, f.start_time_unix_nano, f.span_id
