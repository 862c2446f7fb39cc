-- _failure_graph: DuckDB table macros shared by the failure queries (not a named query).
--
-- Loaded by tracedag.pipeline.views.create_views after the views exist. The named queries
-- failures, propagation, root_causes, amplification, trace_summary and workflow_scores call them
-- with their own bound $parameters. The window of traces is passed as a list of trace ids,
-- (select list(trace_id) from win) with win reading trace_window, so the traces view is read once
-- per query however many macros use the window. Definitions (see failures.sql, propagation.sql):
--
--   trace_window(p_since_ns, p_trace_id)
--       every column of traces, for the traces that started at or after p_since_ns (ns since
--       epoch) and, unless p_trace_id is '', only that trace.
--   failure_steps(p_fail_threshold, p_trace_ids)
--       one row per failed step (aggregated score <= p_fail_threshold) of the traces in the list
--       p_trace_ids: trace_id, span_id, step_type, step_name, step_key, iteration, start_time_unix_nano,
--       end_time_unix_nano, duration_ns, score, metric, source, taxonomy_l1, taxonomy_l2,
--       taxonomy_l3, explanation, recovered. Score: the human row if there is one, else the
--       lowest (ties: a row with a taxonomy first, then by metric, source); recovered: a later
--       iteration of the same step key did not fail.
--   failure_graph(p_fail_threshold, p_trace_ids, p_max_hops)
--       the failure_steps rows plus two lists describing the failure DAG: nearest (span ids u with
--       an edge u -> this step: u a non-recovered failure from which this step is reachable along
--       dependency edges whose intermediate steps are not non-recovered failures) and ancestors
--       (struct(a, dist) for every failure a reaching this step in the failure DAG; dist = hops of
--       the longest path, the closure stops after p_max_hops hops). Call it once per query
--       (a materialized CTE) and unnest the lists into the edge (fe) and closure (anc) relations.
--   failure_roots(p_fail_threshold, p_trace_ids, p_max_hops)
--       the failure_graph rows plus greedy_root_id, greedy_hops (the greedy walk of root_causes.sql:
--       from the step, move to its lowest-scoring failure-DAG predecessor, ties earliest start then
--       span_id, until there is none or after p_max_hops moves) and final (the step is the final
--       failure of its trace: non-recovered, no failure downstream, most failures upstream, ties
--       latest end then span_id).
--   workflow_weights(p_trace_ids, p_unscored_score)
--       every step of the traces in p_trace_ids: trace_id, span_id, score (lowest human score if
--       any, else the lowest score; null when unscored), weight (1 + call-tree descendants), used_score (score
--       clamped to >= 1, p_unscored_score when unscored, null when that is negative).
create or replace macro trace_window(p_since_ns, p_trace_id) as table
select *
from traces
where coalesce(start_time_unix_nano, 0) >= cast(p_since_ns as bigint)
  and (cast(p_trace_id as varchar) = '' or trace_id = cast(p_trace_id as varchar));

create or replace macro failure_steps(p_fail_threshold, p_trace_ids) as table
with
step_score as (
    -- every step with a failing score row or a human row: the human row if there is one, else the
    -- lowest score (ties: a row with a taxonomy first, then by metric, source). A step without such
    -- a row cannot fail, so the other rows are never read past the filter.
    select trace_id, span_id, unnest(best)
    from (
        select trace_id, span_id,
               arg_min({'score': cast(score as double), 'metric': metric, 'source': source,
                        'taxonomy_l1': taxonomy_l1, 'taxonomy_l2': taxonomy_l2,
                        'taxonomy_l3': taxonomy_l3, 'explanation': explanation},
                       (coalesce(source, '') <> 'human', cast(score as double), taxonomy_l1 is null,
                        metric, source)) as best
        from step_scores
        where score is not null
          and (cast(score as double) <= cast(p_fail_threshold as double) or source = 'human')
          and trace_id in (select unnest(p_trace_ids))
        group by trace_id, span_id
    )
),
failed_step as (
    select * from step_score where score <= cast(p_fail_threshold as double)
),
tnode as materialized (
    -- the steps of the traces that have a failure
    select trace_id, span_id, cast(step_type as varchar) as step_type, step_name,
           coalesce(step_key, step_name, span_id) as step_key, coalesce(iteration, 1) as iteration,
           start_time_unix_nano, end_time_unix_nano, duration_ns
    from dag_nodes
    where trace_id in (select trace_id from failed_step)
),
fail_node as (
    select n.*, s.score, s.metric, s.source, s.taxonomy_l1, s.taxonomy_l2, s.taxonomy_l3, s.explanation
    from failed_step s
    join tnode n on n.trace_id = s.trace_id and n.span_id = s.span_id
),
last_ok as (
    -- per step key that has a failure: the last iteration that did not fail
    select n.trace_id, n.step_key, max(n.iteration) as iteration
    from tnode n
    semi join fail_node k on k.trace_id = n.trace_id and k.step_key = n.step_key
    anti join fail_node g on g.trace_id = n.trace_id and g.span_id = n.span_id
    group by n.trace_id, n.step_key
)
-- recovered: a later iteration of the same step key did not fail
select f.*, coalesce(l.iteration > f.iteration, false) as recovered
from fail_node f
left join last_ok l on l.trace_id = f.trace_id and l.step_key = f.step_key;

create or replace macro failure_graph(p_fail_threshold, p_trace_ids, p_max_hops) as table
with recursive
fail as materialized (
    from failure_steps(p_fail_threshold, p_trace_ids)
),
src as (
    select trace_id, span_id from fail where not recovered
),
dep as (
    select e.trace_id, e.upstream_span_id as up, e.downstream_span_id as down,
           s.span_id is not null as down_is_src
    from dag_edges e
    left join src s on s.trace_id = e.trace_id and s.span_id = e.downstream_span_id
    where e.upstream_span_id is not null and e.downstream_span_id is not null
      and e.trace_id in (select trace_id from src)
),
-- walk downstream from every non-recovered failure, stopping at the next non-recovered failure
-- (a UNION over a finite set of (failure, step) pairs, so it ends even on a cyclic edge set)
reach(trace_id, src_id, node_id, stop) as (
    select d.trace_id, d.up, d.down, d.down_is_src
    from dep d join src s on s.trace_id = d.trace_id and s.span_id = d.up
    union
    select r.trace_id, r.src_id, d.down, d.down_is_src
    from reach r join dep d on d.trace_id = r.trace_id and d.up = r.node_id
    where not r.stop
),
fe as materialized (
    select distinct r.trace_id, r.src_id as up, r.node_id as down
    from reach r join fail f on f.trace_id = r.trace_id and f.span_id = r.node_id
    where r.src_id <> r.node_id
),
-- transitive failing upstream; dist = hops of the longest failure-DAG path (USING KEY keeps the last)
anc(trace_id, v, a, dist) using key (trace_id, v, a) as (
    select trace_id, down, up, 1 from fe
    union
    select anc.trace_id, anc.v, fe.up, anc.dist + 1
    from anc join fe on fe.trace_id = anc.trace_id and fe.down = anc.a
    where anc.dist < cast(p_max_hops as integer)
),
nearest as (
    select trace_id, down as span_id, list(up) as nearest from fe group by all
),
ancestors as (
    select trace_id, v as span_id, list({'a': a, 'dist': dist}) as ancestors from anc group by all
)
select f.*, coalesce(n.nearest, []::varchar[]) as nearest,
       coalesce(x.ancestors, []::struct(a varchar, dist integer)[]) as ancestors
from fail f
left join nearest n on n.trace_id = f.trace_id and n.span_id = f.span_id
left join ancestors x on x.trace_id = f.trace_id and x.span_id = f.span_id;

create or replace macro workflow_weights(p_trace_ids, p_unscored_score) as table
with
step_score as (
    -- one row per step: the lowest human score if there is one, else the lowest score
    select trace_id, span_id,
           coalesce(min(cast(score as double)) filter (where source = 'human'), min(cast(score as double)))
               as score
    from step_scores
    where score is not null and trace_id in (select unnest(p_trace_ids))
    group by trace_id, span_id
)
select n.trace_id, n.span_id, s.score,
       1 + coalesce(greatest((n.nested_right - n.nested_left - 1) // 2, 0), 0) as weight,
       case when s.score is not null then greatest(s.score, 1.0)
            when cast(p_unscored_score as double) >= 0 then greatest(cast(p_unscored_score as double), 1.0)
       end as used_score
from dag_nodes n
left join step_score s on s.trace_id = n.trace_id and s.span_id = n.span_id
where n.trace_id in (select unnest(p_trace_ids));

create or replace macro failure_roots(p_fail_threshold, p_trace_ids, p_max_hops) as table
with recursive
g as materialized (
    from failure_graph(p_fail_threshold, p_trace_ids, p_max_hops)
),
fail as (
    select * exclude (nearest, ancestors) from g
),
fe as (
    select trace_id, unnest(nearest) as up, span_id as down from g
),
anc as (
    select trace_id, span_id as v, unnest(ancestors, recursive := true) from g
),
gnext as (
    select fe.trace_id, fe.down as v, fe.up as nxt
    from fe join fail u on u.trace_id = fe.trace_id and u.span_id = fe.up
    qualify row_number() over (
        partition by fe.trace_id, fe.down order by u.score, u.start_time_unix_nano, fe.up) = 1
),
walk(trace_id, start_id, cur, hops) as (
    select trace_id, span_id, span_id, 0 from fail
    union all
    select w.trace_id, w.start_id, g.nxt, w.hops + 1
    from walk w join gnext g on g.trace_id = w.trace_id and g.v = w.cur
    where w.hops < cast(p_max_hops as integer)
),
greedy as (
    select trace_id, start_id as span_id, cur as root_id, hops
    from walk
    qualify row_number() over (partition by trace_id, start_id order by hops desc) = 1
),
upstream_count as (
    select trace_id, v as span_id, count(*) as n from anc group by all
),
final as (
    select f.trace_id, f.span_id
    from fail f
    left join upstream_count c on c.trace_id = f.trace_id and c.span_id = f.span_id
    where not f.recovered
      and not exists (select 1 from fe where fe.trace_id = f.trace_id and fe.up = f.span_id)
    qualify row_number() over (
        partition by f.trace_id
        order by coalesce(c.n, 0) desc, f.end_time_unix_nano desc nulls last, f.span_id) = 1
)
select g.*, r.root_id as greedy_root_id, r.hops as greedy_hops, x.span_id is not null as final
from g
join greedy r on r.trace_id = g.trace_id and r.span_id = g.span_id
left join final x on x.trace_id = g.trace_id and x.span_id = g.span_id;
