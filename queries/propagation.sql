-- propagation: for each failed step, originating or propagated, its failing upstream steps (in its trace or, per conversation, earlier turns) and its longest failure chain.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores,
--          spans, read through the macro failure_dag of _failure_graph.sql
-- Output:  trace_id, span_id, step_type, step_name, iteration, score, taxonomy_l1, taxonomy_l2,
--          taxonomy_l3, recovered, kind ('originating' | 'propagated'), nearest_failing_upstream
--          (by start), failing_upstream (by start), longest_chain, start_time,
--          start_time_unix_nano, recovered_by, cancelled, turn_index
-- columns: step_name, step_type, score, taxonomy_l1, kind, longest_chain, recovered, trace_id
-- Params:
--   $fail_threshold  double  = 2.0   a step fails when its score (the minimum over its step_scores rows) is <= this (scale 1..5)
--   $since_ns        bigint  = 0     only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''    only this trace ('' = every trace)
--   $max_hops        integer = 1000  bound on the failure-chain recursion
--   $per             varchar = trace one of trace|conversation: propagate within each trace, or across the turns of each conversation
--
-- Step score and category as in failures.sql (the minimum over its step_scores rows; human labels override).
-- Dependency direction (dag_edges): an earlier sibling influences a later one, a child its parent.
-- A failure is *recovered* (recovered_by = the step that did it) when
--   a retry fixed it: a later iteration of the same step_key did not fail, or
--   another route fixed it: a later step of the same step_type under the same parent, with another
--   step_key, starting after the failure ended, did not fail and serves the same purpose (its input
--   contains every argument value of the failed step: the leaves of its JSON input, else its input
--   text; and, for tools, the two names share a word of 4+ letters that is not a generic one such
--   as fetch, lookup, search, cache, backup, fallback, service), while the parent (the step that
--   answers) does not fail and no step under the parent starting after that route fails.
-- A failure is *cancelled* when its span's error type or status message names a cancellation
-- (CancelledError, asyncio.exceptions.CancelledError, context.Canceled, CANCELLED, ...).
-- Recovered and cancelled failures are never a cause: propagation does not start from them (they
-- may themselves be propagated, and paths pass through them). A cancelled step is propagated from
-- the failure that made its caller cancel it: the failures (neither cancelled nor recovered) that
-- ended no later than it, are not its ancestors and whose parent encloses it, the nearest level only.
-- Failure DAG: an edge u -> v when u is a failure neither recovered nor cancelled (a source), v a
-- failure, and v is reachable from u along dependency edges whose intermediate steps are not sources.
-- per=conversation: the traces sharing conversation_id are the turns of a conversation (start
-- order, turn_index 1, 2, ...; every turn of a conversation with a trace in the window is read);
-- the root span of turn k is upstream of every step of turn k + 1 that has no upstream step in
-- its trace, so a failure reaches the later turns; a failure of the environment (taxonomy timeout,
-- rate_limited, connection_error, content_filtered, or http_error on an llm step) gets no failing
-- upstream from an earlier turn. The ids in the lists are then trace_id/span_id.
-- nearest_failing_upstream = the u of those edges; failing_upstream = every failure that reaches v
-- in the failure DAG (transitively). kind = 'propagated' when failing_upstream is not empty.
-- longest_chain = hops of the longest failure-DAG path from an originating failure to the step
-- (0 for an originating failure); root_causes.sql has the same longest_chain beside hops_from_root,
-- the hops from the root its strategy chose, which need not start the longest chain.
-- Recursion bounds: the downstream walk (reach) is a UNION over a finite set of (failure, step)
-- pairs, so it ends even on a cyclic edge set; the failure-DAG closure and the greedy walk stop
-- after $max_hops hops.
with
win as (
    select trace_id, conversation_id from trace_window($since_ns, $trace_id)
),
turns as materialized (
    select trace_id, turn_index
    from conversation_turns((
        select list(trace_id) from traces
        where coalesce(conversation_id, trace_id) in (select coalesce(conversation_id, trace_id) from win)))
),
g as materialized (
    -- one call: within each trace, or (per=conversation) across the turns of whole conversations
    from failure_dag($fail_threshold,
                     (select list(trace_id) from turns
                      where cast($per as varchar) = 'conversation' or trace_id in (select trace_id from win)),
                     $max_hops, cast($per as varchar) = 'conversation')
),
fail as (
    select * exclude (nearest, ancestors, direct) from g
),
fe as (
    -- the failure DAG: an edge up -> down
    select grp, unnest(nearest) as up, node as down from g
),
anc as (
    -- its closure: a fails upstream of v, dist = hops of the longest path from a to v
    select grp, node as v, unnest(ancestors, recursive := true) from g
),
nearest as (
    select fe.grp, fe.down as node,
           list(fe.up order by u.start_time_unix_nano, fe.up) as nearest_failing_upstream
    from fe join fail u on u.grp = fe.grp and u.node = fe.up
    group by all
),
upstream as (
    select anc.grp, anc.v as node,
           list(anc.a order by u.start_time_unix_nano, anc.a) as failing_upstream,
           max(anc.dist) as longest_chain
    from anc join fail u on u.grp = anc.grp and u.node = anc.a
    group by all
)
select f.trace_id, f.span_id, f.step_type, f.step_name, f.iteration, f.score,
       f.taxonomy_l1, f.taxonomy_l2, f.taxonomy_l3, f.recovered,
       case when u.node is null then 'originating' else 'propagated' end as kind,
       coalesce(n.nearest_failing_upstream, []::varchar[]) as nearest_failing_upstream,
       coalesce(u.failing_upstream, []::varchar[]) as failing_upstream,
       coalesce(u.longest_chain, 0) as longest_chain,
       make_timestamp(f.start_time_unix_nano // 1000) as start_time, f.start_time_unix_nano,
       f.recovered_by, f.cancelled, t.turn_index
from fail f
join turns t on t.trace_id = f.trace_id
left join nearest n on n.grp = f.grp and n.node = f.node
left join upstream u on u.grp = f.grp and u.node = f.node
order by f.trace_id, f.start_time_unix_nano, f.span_id
