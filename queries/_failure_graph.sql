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
--       one row per failed step (score, the minimum over its step_scores rows, <= p_fail_threshold) of the traces in the list
--       p_trace_ids: trace_id, span_id, parent_span_id, step_type, step_name, step_key, iteration,
--       start_time_unix_nano, end_time_unix_nano, duration_ns, score, metric, source, taxonomy_l1,
--       taxonomy_l2, taxonomy_l3, explanation, depth (in the call tree, the root 0), recovered,
--       recovered_by, recovery ('retry' | 'route'), cancelled, cancelled_by (the failures a
--       cancelled step is the effect of). Score: the human row if there is one, else the lowest
--       (ties: a row with a taxonomy first, then by metric, source); recovered: a retry (a later
--       iteration of the same step key redoing the same operation, its span name without ids but
--       with its numbers, did not fail, and every failed tool call the step emitted, along its
--       tool_call edges, was itself retried or routed, and no call it emitted ran nowhere with
--       arguments that break the tool's schema: a PARAMGEN failure without a failed tool behind
--       it) or another route fixed it (the rule is in
--       propagation.sql), or the failure is one carried up from a recovered child (its status
--       message holds the child's); recovered_by = that step; cancelled: the span's error type or
--       status message names a cancellation.
--   conversation_turns(p_trace_ids)
--       trace_id, conversation_id, conversation_key (conversation_id, else the trace id), turn_index
--       (1, 2, ... by start within the conversation, over the traces in the list), root_span_id.
--   failure_dag(p_fail_threshold, p_trace_ids, p_max_hops, p_across_turns)
--       the failure_steps rows with grp, node (the trace and span id; across turns the conversation
--       key and trace_id/span_id) and turn_index (across turns only), plus three lists describing
--       the failure DAG: nearest (node keys u with an edge u -> this step: u a source, i.e. a failure
--       neither recovered nor cancelled, from which this step is reachable along dependency edges
--       whose intermediate steps are not sources; plus the trigger of a cancelled step), ancestors
--       (struct(a, dist) for every failure a reaching this step in the failure DAG; dist = hops of
--       the longest path, the closure stops after p_max_hops hops) and direct (sources with a
--       dependency edge straight into this step, AgentEval's failing direct parents). Across turns
--       (p_across_turns true, p_trace_ids whole conversations) the root of turn k is upstream of the
--       steps of turn k + 1 without an upstream step in their trace, and no edge from an earlier
--       turn enters a failure of the environment. Call it once per query (a materialized CTE).
--   failure_graph(p_fail_threshold, p_trace_ids, p_max_hops)
--       failure_dag within each trace, without grp, node and turn_index.
--   failure_dag_roots(p_fail_threshold, p_trace_ids, p_max_hops, p_across_turns)
--       the failure_dag rows plus greedy_root_id, greedy_hops (the greedy walk of root_causes.sql:
--       from the step, move to its lowest-scoring failure-DAG predecessor, ties the earliest turn,
--       then the deepest in the call tree, then earliest start, then node key, until there is none
--       or after p_max_hops moves) and final (the step is the final failure of its group:
--       non-recovered, no failure downstream, not cancelled while another is left, the latest turn,
--       most failures upstream, ties latest end then node key).
--   failure_roots(p_fail_threshold, p_trace_ids, p_max_hops)
--       failure_dag_roots within each trace, without grp, node and turn_index.
--   workflow_weights(p_trace_ids, p_unscored_score)
--       every step of the traces in p_trace_ids: trace_id, span_id, score (lowest human score if
--       any, else the lowest score; null when unscored), weight (1 + desc(v), AgentEval's number of
--       steps that depend on v: its call-tree ancestors plus, for it and each ancestor, the
--       siblings that start at or after it ends, the builder's sibling order; 1 in a trace without
--       a nested set), used_score (score clamped to >= 1, p_unscored_score when unscored, null when
--       that is negative).
create or replace macro trace_window(p_since_ns, p_trace_id) as table
select *
from traces
where coalesce(start_time_unix_nano, 0) >= cast((case when p_since_ns is null then error('trace_window(): p_since_ns must be a time in ns, not NULL (0 = every trace)') else p_since_ns end) as bigint)
  and (cast((case when p_trace_id is null then error('trace_window(): p_trace_id must be a trace id, not NULL ('''' = every trace)') else p_trace_id end) as varchar) = ''
       or trace_id = cast(p_trace_id as varchar));

create or replace macro failure_steps(p_fail_threshold, p_trace_ids) as table
with recursive
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
          and (cast(score as double) <= cast((case when p_fail_threshold is null then error('failure_steps(): p_fail_threshold must be a score, not NULL') else p_fail_threshold end) as double)
               or source = 'human')
          and trace_id in (select unnest((case when typeof(p_trace_ids) in ('NULL', '"NULL"') then error('failure_steps(): p_trace_ids must be a list of trace ids, e.g. (select list(trace_id) from traces), not NULL') else p_trace_ids end)))
        group by trace_id, span_id
    )
),
failed_step as (
    select * from step_score
    where score <= cast((case when p_fail_threshold is null then error('failure_steps(): p_fail_threshold must be a score, not NULL') else p_fail_threshold end) as double)
),
tnode as materialized (
    -- the steps of the traces that have a failure
    select trace_id, span_id, parent_span_id, cast(step_type as varchar) as step_type, step_name,
           coalesce(step_key, step_name, span_id) as step_key, coalesce(iteration, 1) as iteration,
           start_time_unix_nano, end_time_unix_nano, duration_ns, depth, nested_left, nested_right
    from dag_nodes
    where trace_id in (select trace_id from failed_step)
),
fail_node as materialized (
    select n.* exclude (nested_left, nested_right), s.score, s.metric, s.source, s.taxonomy_l1, s.taxonomy_l2, s.taxonomy_l3, s.explanation
    from failed_step s
    join tnode n on n.trace_id = s.trace_id and n.span_id = s.span_id
),
later as materialized (
    -- a later iteration of a failed step's key that did not fail
    select f.trace_id, f.span_id, n.span_id as by_id, n.iteration
    from fail_node f
    join tnode n on n.trace_id = f.trace_id and n.step_key = f.step_key and n.iteration > f.iteration
    anti join fail_node g on g.trace_id = n.trace_id and g.span_id = n.span_id
),
op as (
    -- the operation a span performs: its name without ids (uuids, 0x and long hex runs) but with its
    -- numbers, which step keys drop: smolagents' 'Step 1' and 'Step 2' are two iterations of a loop,
    -- not one operation redone (the tool, model or node that failed is named the same each time)
    select s.trace_id, s.span_id,
           any_value(regexp_replace(coalesce(s.name, ''),
               '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|\b0[xX][0-9a-fA-F]+\b|\b[0-9a-fA-F]{12,}\b',
               '', 'g')) as op
    from spans s
    semi join (select trace_id, span_id from later union all select trace_id, by_id from later) k
        on k.trace_id = s.trace_id and k.span_id = s.span_id
    where s.trace_id in (select trace_id from later)
    group by all
),
retry as (
    -- recovered by a retry: a later iteration of the same step key that redoes the same operation
    -- (op) did not fail (the first one)
    select l.trace_id, l.span_id, arg_min(l.by_id, l.iteration) as by_id
    from later l
    join op a on a.trace_id = l.trace_id and a.span_id = l.span_id
    join op b on b.trace_id = l.trace_id and b.span_id = l.by_id
    where a.op = b.op
    group by all
),
cand as materialized (
    -- another route: a later step (starting after the failure ended) of the same type under the
    -- same parent, with another step key, that did not fail, for a failure no retry recovered; a
    -- tool's route shares a name word with it (4+ letters, not a generic one); the parent (the step
    -- that answers) does not fail and no step under it that starts after the route fails
    select f.trace_id, f.span_id, w.span_id as cand_id, w.start_time_unix_nano as cand_start
    from (select *, hash(trace_id, parent_span_id, step_type) as sib_key
          from fail_node anti join retry r using (trace_id, span_id)) f
    join (select *, hash(trace_id, parent_span_id, step_type) as sib_key from tnode) w
        on w.sib_key = f.sib_key and w.trace_id = f.trace_id and w.parent_span_id = f.parent_span_id
           and w.step_type = f.step_type and w.step_key <> f.step_key
           and w.start_time_unix_nano >= f.end_time_unix_nano
    anti join fail_node x on x.trace_id = w.trace_id and x.span_id = w.span_id
    where (f.step_type <> 'tool'
           or len(list_intersect(
                  list_filter(regexp_split_to_array(lower(f.step_name), '[^a-z0-9]+'),
                              lambda x: length(x) >= 4 and not list_contains(
                                  ['tool', 'call', 'execute', 'invoke', 'function', 'fetch', 'lookup', 'query',
                                   'find', 'read', 'load', 'search', 'list', 'check', 'send', 'create',
                                   'update', 'delete', 'service', 'backup', 'cache', 'cached', 'fallback',
                                   'retry', 'primary', 'secondary', 'remote', 'local', 'http', 'chat'], x)),
                  regexp_split_to_array(lower(w.step_name), '[^a-z0-9]+'))) > 0)
      and not exists (select 1 from failed_step p where p.trace_id = f.trace_id and p.span_id = f.parent_span_id)
      and not exists (select 1 from fail_node z where z.trace_id = f.trace_id
                      and z.parent_span_id = f.parent_span_id and z.start_time_unix_nano > w.start_time_unix_nano)
),
err as (
    -- error type and status message of the failed steps (spans read for these only)
    select s.trace_id, s.span_id, any_value(s.error_type) as error_type, any_value(s.status_message) as status_message
    from spans s
    semi join fail_node k on k.trace_id = s.trace_id and k.span_id = s.span_id
    where s.trace_id in (select trace_id from failed_step)
    group by all
),
txt as materialized (
    -- input of the failures with a candidate route and of their candidates
    select s.trace_id, s.span_id, any_value(s.input_text) as input_text
    from spans s
    semi join (select trace_id, span_id from cand union all select trace_id, cand_id from cand) k
        on k.trace_id = s.trace_id and k.span_id = s.span_id
    where s.trace_id in (select trace_id from cand)
    group by all
),
fargs as (
    -- the argument values of a failed step with a candidate route (lower case): the leaves of its
    -- JSON input, else its whole input text
    select t.trace_id, t.span_id,
           case when json_valid(t.input_text)
                then coalesce(list(lower(json_extract_string(j.value, '$')))
                                  filter (where j.atom is not null and json_extract_string(j.value, '$') <> ''),
                              [])
                when coalesce(t.input_text, '') <> '' then [lower(t.input_text)]
                else [] end as vals
    from txt t
    semi join cand c on c.trace_id = t.trace_id and c.span_id = t.span_id
    left join lateral (
        select * from json_tree(case when json_valid(t.input_text) then t.input_text else '{}' end)
    ) j on true
    group by t.trace_id, t.span_id, t.input_text
),
route as (
    -- recovered by another route: the first candidate that carries every argument value of the failed step
    select c.trace_id, c.span_id, arg_min(c.cand_id, (c.cand_start, c.cand_id)) as by_id
    from cand c
    left join fargs a on a.trace_id = c.trace_id and a.span_id = c.span_id
    left join txt w on w.trace_id = c.trace_id and w.span_id = c.cand_id
    where coalesce(list_bool_and(list_transform(coalesce(a.vals, []),
                                                lambda v: contains(lower(coalesce(w.input_text, '')), v))), true)
    group by all
),
unredone as (
    -- a model step whose tool call failed and was neither retried nor routed around: a later
    -- iteration of the model step (an apology, another plan) did not redo what it broke
    select distinct e.trace_id, e.upstream_span_id as span_id
    from dag_edges e
    join fail_node t on t.trace_id = e.trace_id and t.span_id = e.downstream_span_id
    anti join retry r on r.trace_id = t.trace_id and r.span_id = t.span_id
    anti join route o on o.trace_id = t.trace_id and o.span_id = t.span_id
    where e.edge_kind = 'tool_call' and e.trace_id in (select trace_id from failed_step)
    union
    -- a model step failing on the arguments of a call that ran nowhere (no tool_call edge to a failed
    -- step: smolagents rejects a call before running the tool); scoring already left out the calls
    -- a later model step redid, so no later iteration recovers it
    select f.trace_id, f.span_id from fail_node f
    where f.step_type = 'llm' and f.metric = 'arguments' and f.source = 'rule'
      and not exists (select 1 from dag_edges e join fail_node t
                          on t.trace_id = e.trace_id and t.span_id = e.downstream_span_id
                      where e.edge_kind = 'tool_call' and e.trace_id = f.trace_id and e.upstream_span_id = f.span_id)
),
redone as (
    -- recovered by a retry: a later iteration fixed it, and every tool call it emitted that failed was redone
    select r.* from retry r anti join unredone u using (trace_id, span_id)
),
carried(trace_id, span_id, by_id, recovery) using key (trace_id, span_id) as (
    -- a failure carried up from a recovered step: the parent's error text holds the child's status
    -- message (smolagents' 'Step 1' fails with the AgentToolExecutionError wrapping the tool's
    -- error), so a retry or route that recovered the child recovers the parent (and its parent)
    select trace_id, span_id, by_id, 'retry' from redone
    union
    select trace_id, span_id, by_id, 'route' from route
    union
    select p.trace_id, p.span_id, c.by_id, c.recovery
    from carried c
    join fail_node k on k.trace_id = c.trace_id and k.span_id = c.span_id
    join fail_node p on p.trace_id = k.trace_id and p.span_id = k.parent_span_id
    join err ke on ke.trace_id = k.trace_id and ke.span_id = k.span_id
    join err pe on pe.trace_id = p.trace_id and pe.span_id = p.span_id
    where trim(coalesce(ke.status_message, '')) <> ''
      and contains(regexp_replace(lower(coalesce(pe.status_message, '')), '\s+', ' ', 'g'),
                   regexp_replace(lower(trim(ke.status_message)), '\s+', ' ', 'g'))
),
flagged as materialized (
    -- recovered: a retry or another route fixed it; cancelled: the step was cancelled (its error type
    -- or status message names a cancellation: CancelledError, asyncio.CancelledError, Canceled, ...)
    select f.*, r.span_id is not null as recovered, r.by_id as recovered_by, r.recovery,
           coalesce(regexp_matches(t.error_type, '(^|[.:/ ])(cancel+ed|cancel+ation)(error|exception)?$', 'i')
                    or regexp_matches(t.status_message, '^\s*(cancel+ed|cancel+ation)(error|exception)?\b', 'i'),
                    false) as cancelled
    from fail_node f
    left join carried r on r.trace_id = f.trace_id and r.span_id = f.span_id
    left join err t on t.trace_id = f.trace_id and t.span_id = f.span_id
),
cancelled_step as materialized (
    -- the cancelled failures with their place in the call tree (usually none: the joins on the
    -- nested set below then read nothing)
    select c.trace_id, c.span_id, c.parent_span_id, c.end_time_unix_nano, n.nested_left, n.nested_right
    from flagged c
    join tnode n on n.trace_id = c.trace_id and n.span_id = c.span_id
    where c.cancelled
),
trigger_cand as materialized (
    -- the failures neither cancelled nor recovered that ended no later than a cancelled step of their trace
    select c.trace_id, c.span_id, c.parent_span_id as c_parent, c.nested_left as c_left, c.nested_right as c_right,
           t.span_id as trigger_id, t.parent_span_id
    from cancelled_step c
    join flagged t on t.trace_id = c.trace_id and t.span_id <> c.span_id and not t.cancelled
                  and not t.recovered and t.end_time_unix_nano <= c.end_time_unix_nano
),
trigger as (
    -- what a cancelled step is the effect of: the failures of trigger_cand that are not its
    -- ancestors and whose parent encloses it (it, or one of its ancestors, is their sibling); the
    -- nearest level only
    select trace_id, span_id, list(trigger_id order by trigger_id) as cancelled_by
    from (
        select c.trace_id, c.span_id, c.trigger_id
        from trigger_cand c
        join tnode tn on tn.trace_id = c.trace_id and tn.span_id = c.trigger_id
        left join tnode p on p.trace_id = c.trace_id and p.span_id = c.parent_span_id
        where (c.parent_span_id = c.c_parent
               or (p.nested_left < c.c_left and c.c_right < p.nested_right))
          and not coalesce(tn.nested_left < c.c_left and c.c_right < tn.nested_right, false)
        qualify rank() over (partition by c.trace_id, c.span_id order by tn.depth desc nulls last) = 1
    )
    group by all
)
select f.*, coalesce(g.cancelled_by, []::varchar[]) as cancelled_by
from flagged f
left join trigger g on g.trace_id = f.trace_id and g.span_id = f.span_id;

create or replace macro conversation_turns(p_trace_ids) as table
select trace_id, conversation_id, coalesce(conversation_id, trace_id) as conversation_key,
       row_number() over (partition by coalesce(conversation_id, trace_id)
                          order by start_time_unix_nano, trace_id) as turn_index,
       root_span_id
from traces
where trace_id in (select unnest((case when typeof(p_trace_ids) in ('NULL', '"NULL"') then error('conversation_turns(): p_trace_ids must be a list of trace ids, e.g. (select list(trace_id) from traces), not NULL') else p_trace_ids end)));

create or replace macro failure_dag(p_fail_threshold, p_trace_ids, p_max_hops, p_across_turns) as table
with recursive
steps as materialized (
    from failure_steps(p_fail_threshold, p_trace_ids)
),
turn as materialized (
    from conversation_turns(p_trace_ids) where (case when p_across_turns is null then error('failure_dag(): p_across_turns must be true or false, not NULL') else p_across_turns end)
),
fail as materialized (
    -- node keys: the span id within a trace; trace_id/span_id within a conversation
    select case when p_across_turns then t.conversation_key else f.trace_id end as grp,
           case when p_across_turns then f.trace_id || '/' || f.span_id else f.span_id end as node,
           t.turn_index, f.*
    from steps f
    left join turn t on t.trace_id = f.trace_id
),
src as (
    -- where propagation starts: failures neither recovered nor cancelled
    select grp, node from fail where not recovered and not cancelled
),
scope as (
    -- the traces whose edges are read: those with a source (across turns: every trace of a
    -- conversation with a source)
    select trace_id from fail where not recovered and not cancelled
    union
    select t.trace_id from turn t where t.conversation_key in (select grp from src)
),
trace_edge as materialized (
    -- dependency edges; data edges (value provenance) are not: root_causes reads them for silent producers
    select trace_id, upstream_span_id as up, downstream_span_id as down
    from dag_edges
    where trace_id in (select trace_id from scope)
      and upstream_span_id is not null and downstream_span_id is not null
      and edge_kind is distinct from 'data'
),
entry as (
    -- the steps of a trace without an upstream step in it (the root of a trace without edges)
    select distinct e.trace_id, e.up as span_id
    from trace_edge e
    anti join trace_edge d on d.trace_id = e.trace_id and d.down = e.up
    where p_across_turns
    union
    select t.trace_id, t.root_span_id from turn t
    where t.root_span_id is not null and t.trace_id not in (select trace_id from trace_edge)
),
edge as (
    -- dependency edges up -> down between node keys
    select coalesce(t.conversation_key, e.trace_id) as grp,
           case when p_across_turns then e.trace_id || '/' || e.up else e.up end as up,
           case when p_across_turns then e.trace_id || '/' || e.down else e.down end as down
    from trace_edge e
    left join turn t on t.trace_id = e.trace_id
    union all
    -- across turns: the root of turn k is upstream of every entry step of turn k + 1 (so of the
    -- whole turn)
    select a.conversation_key, a.trace_id || '/' || a.root_span_id, n.trace_id || '/' || n.span_id
    from turn a
    join turn b on b.conversation_key = a.conversation_key and b.turn_index = a.turn_index + 1
    join entry n on n.trace_id = b.trace_id
    where a.root_span_id is not null and a.conversation_key in (select grp from src)
),
dep as (
    select d.grp, d.up, d.down, s.node is not null as down_is_src
    from edge d
    left join src s on s.grp = d.grp and s.node = d.down
),
-- walk downstream from every source, stopping at the next source (a UNION over a finite set of
-- (source, step) pairs, so it ends even on a cyclic edge set)
reach(grp, src_id, node_id, stop) as (
    select d.grp, d.up, d.down, d.down_is_src
    from dep d join src s on s.grp = d.grp and s.node = d.up
    union
    select r.grp, r.src_id, d.down, d.down_is_src
    from reach r join dep d on d.grp = r.grp and d.up = r.node_id
    where not r.stop
),
external as (
    -- failures an earlier turn cannot cause: the environment's (timeouts, rate limits, connection
    -- errors, content filters, the model provider's HTTP errors)
    select grp, node, trace_id from fail
    where taxonomy_l3 in ('timeout', 'rate_limited', 'connection_error', 'content_filtered')
       or (step_type = 'llm' and taxonomy_l3 = 'http_error')
),
trig as (
    -- a cancelled step is an effect of the failures that made its caller cancel it (cancelled_by)
    select c.grp, t.node as up, c.node as down
    from (select grp, node, trace_id, unnest(cancelled_by) as trigger_id from fail) c
    join fail t on t.grp = c.grp and t.trace_id = c.trace_id and t.span_id = c.trigger_id
),
fe as materialized (
    -- the failure DAG: up is a source and down the nearest failure downstream of it (across turns,
    -- never into a failure of the environment), plus trigger -> cancelled
    select distinct r.grp, r.src_id as up, r.node_id as down
    from reach r
    join fail f on f.grp = r.grp and f.node = r.node_id
    join fail u on u.grp = r.grp and u.node = r.src_id
    where r.src_id <> r.node_id
      and (u.trace_id = f.trace_id
           or not exists (select 1 from external x where x.grp = f.grp and x.node = f.node))
    union
    select grp, up, down from trig
),
direct as (
    -- AgentEval's failing direct parents: a dependency edge from a source into a failure (same
    -- exclusions), plus trigger -> cancelled
    select distinct d.grp, d.up, d.down
    from dep d
    join src s on s.grp = d.grp and s.node = d.up
    join fail f on f.grp = d.grp and f.node = d.down
    join fail u on u.grp = d.grp and u.node = d.up
    where u.trace_id = f.trace_id
       or not exists (select 1 from external x where x.grp = f.grp and x.node = f.node)
    union
    select grp, up, down from trig
),
-- transitive failing upstream; dist = hops of the longest failure-DAG path (USING KEY keeps the last)
anc(grp, v, a, dist) using key (grp, v, a) as (
    select grp, down, up, 1 from fe
    union
    select anc.grp, anc.v, fe.up, anc.dist + 1
    from anc join fe on fe.grp = anc.grp and fe.down = anc.a
    where anc.dist < cast((case when p_max_hops is null then error('failure_dag(): p_max_hops must be a number of hops, not NULL') else p_max_hops end) as integer)
),
nearest as (
    select grp, down as node, list(up) as nearest from fe group by all
),
ancestors as (
    select grp, v as node, list({'a': a, 'dist': dist}) as ancestors from anc group by all
),
direct_list as (
    select grp, down as node, list(up) as direct from direct group by all
)
select f.*, coalesce(n.nearest, []::varchar[]) as nearest,
       coalesce(x.ancestors, []::struct(a varchar, dist integer)[]) as ancestors,
       coalesce(d.direct, []::varchar[]) as direct
from fail f
left join nearest n on n.grp = f.grp and n.node = f.node
left join ancestors x on x.grp = f.grp and x.node = f.node
left join direct_list d on d.grp = f.grp and d.node = f.node;

create or replace macro failure_graph(p_fail_threshold, p_trace_ids, p_max_hops) as table
select * exclude (grp, node, turn_index) from failure_dag(p_fail_threshold, p_trace_ids, p_max_hops, false);

create or replace macro workflow_weights(p_trace_ids, p_unscored_score) as table
with recursive
step_score as (
    -- one row per step: the lowest human score if there is one, else the lowest score (grouped by
    -- rid, the 64-bit hash of the trace and span ids used below)
    select hash(trace_id, span_id) as rid,
           coalesce(min(cast(score as double)) filter (where source = 'human'), min(cast(score as double)))
               as score
    from step_scores
    where score is not null
      and trace_id in (select unnest((case when typeof(p_trace_ids) in ('NULL', '"NULL"') then error('workflow_weights(): p_trace_ids must be a list of trace ids, e.g. (select list(trace_id) from traces), not NULL') else p_trace_ids end)))
    group by rid
),
node as materialized (
    -- integer keys (64-bit hashes: rid of the trace and span ids, prid of the trace and parent ids,
    -- tid of the trace id, pid of the parent id) keep the joins below off the text ids
    select hash(trace_id, span_id) as rid, hash(trace_id, parent_span_id) as prid, trace_id, span_id,
           hash(trace_id) as tid, hash(parent_span_id) as pid, parent_span_id is null as is_root, depth,
           nested_left, start_time_unix_nano as s, end_time_unix_nano as e
    from dag_nodes
    where trace_id in (select unnest(p_trace_ids))
),
kids as (
    select tid, pid, list(s) as starts from node group by all
),
node_w as materialized (
    -- w: the siblings that start at or after the step ended, those the sibling order of the DAG
    -- builder puts after it (B follows A when A ended before B started); a zero-length step is not
    -- after itself. Only in a trace with a nested set (not a flat fallback)
    select n.rid, n.prid, n.is_root, n.depth, len(list_filter(k.starts, lambda x: x >= n.e)) - (n.s >= n.e)::int as w
    from node n
    join kids k on k.tid = n.tid and k.pid is not distinct from n.pid
    where n.nested_left is not null
),
acc(rid, depth, total) as (
    -- desc(v): the steps that depend on v = its call-tree ancestors (a child feeds its parent) plus,
    -- for v and each ancestor, the siblings after it: summed from the root down (parents after
    -- the DAG build's repair are always steps of the trace; a 64-bit hash collision among a
    -- million steps has odds of about 1 in 30 million)
    select rid, depth, w from node_w where is_root
    union all
    select c.rid, c.depth, a.total + c.w from acc a join node_w c on c.prid = a.rid
),
desc_count as (
    select rid, depth + total as n from acc
)
select n.trace_id, n.span_id, s.score,
       1 + coalesce(d.n, 0) as weight,
       case when s.score is not null then greatest(s.score, 1.0)
            when cast((case when p_unscored_score is null then error('workflow_weights(): p_unscored_score must be a score (negative: leave unscored steps out), not NULL') else p_unscored_score end) as double) >= 0
                then greatest(cast(p_unscored_score as double), 1.0)
       end as used_score
from node n
left join step_score s on s.rid = n.rid
left join desc_count d on d.rid = n.rid;

create or replace macro failure_dag_roots(p_fail_threshold, p_trace_ids, p_max_hops, p_across_turns) as table
with recursive
g as materialized (
    from failure_dag(p_fail_threshold, p_trace_ids, p_max_hops, p_across_turns)
),
fail as (
    select * exclude (nearest, ancestors, direct) from g
),
fe as (
    select grp, unnest(nearest) as up, node as down from g
),
anc as (
    select grp, node as v, unnest(ancestors, recursive := true) from g
),
gnext as materialized (
    -- the walk's next step: the lowest-scoring predecessor (ties: the earliest turn, no turn first, the
    -- deepest, the earliest start, the node key; a null sorts after every value in the key). An
    -- aggregate, not a window: the planner sizes a window's partitions by its estimate, ~1e8 rows
    -- for a few hundred
    select fe.grp, fe.down as v,
           arg_min(fe.up, (u.score, u.turn_index is not null, u.turn_index, -u.depth,
                           u.start_time_unix_nano, fe.up)) as nxt
    from fe join fail u on u.grp = fe.grp and u.node = fe.up
    group by fe.grp, fe.down
),
walk(grp, start_id, cur, hops) as (
    select grp, node, node, 0 from fail
    union all
    select w.grp, w.start_id, g.nxt, w.hops + 1
    from walk w join gnext g on g.grp = w.grp and g.v = w.cur
    where w.hops < cast((case when p_max_hops is null then error('failure_dag_roots(): p_max_hops must be a number of hops, not NULL') else p_max_hops end) as integer)
),
greedy as (
    select grp, start_id as node, cur as root_id, hops
    from walk
    qualify row_number() over (partition by grp, start_id order by hops desc) = 1
),
upstream_count as (
    select grp, v as node, count(*) as n from anc group by all
),
final as (
    -- the final failure: non-recovered, nothing failing downstream; a non-cancelled one first, then
    -- the latest turn (across turns), the most failures upstream, the latest end, the node key
    select f.grp, f.node
    from fail f
    left join upstream_count c on c.grp = f.grp and c.node = f.node
    where not f.recovered
      and not exists (select 1 from fe where fe.grp = f.grp and fe.up = f.node)
    qualify row_number() over (
        partition by f.grp
        order by f.cancelled, f.turn_index desc nulls last, coalesce(c.n, 0) desc,
                 f.end_time_unix_nano desc nulls last, f.node) = 1
)
select g.*, r.root_id as greedy_root_id, r.hops as greedy_hops, x.node is not null as final
from g
join greedy r on r.grp = g.grp and r.node = g.node
left join final x on x.grp = g.grp and x.node = g.node;

create or replace macro failure_roots(p_fail_threshold, p_trace_ids, p_max_hops) as table
select * exclude (grp, node, turn_index) from failure_dag_roots(p_fail_threshold, p_trace_ids, p_max_hops, false);
