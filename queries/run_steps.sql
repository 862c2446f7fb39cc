-- run_steps: the ordered steps of every run that determinism and graph utility are computed from.
-- A run is one conversation: all traces sharing run_id, else conversation_id; a trace without
-- either is a run of its own. Each trace of a run is a turn of its trace order; the number of
-- user turns is counted from user_input (see below), not from the traces.
-- Inputs: views spans, dag_nodes, step_scores. (--group-by is applied by the caller, on the root
--   spans, after this query.)
-- agent = the agent_name of the earliest span that has one, else the root's service_name.
-- Steps (kind):
--   node      a graph-node visit: the outermost span of a LangGraph node execution
--             (langgraph_node set and differing from the parent's node or step), or a span marked
--             with gen_ai.node.name / tracedag.node.name / graph.node.name / graph_node_id;
--             name = langgraph_node, else the marking attribute, else step_name. __start__/__end__
--             are not nodes. failed = status ERROR in the node's subtree or a step score <= 2.
--   tool      a tool span (step_type 'tool'); name = tool_name, detail = its arguments
--             (gen_ai.tool.call.arguments, else input_text).
--   response  one per trace: the root's output_text, else the last llm/agent/chain output_text;
--             user_input = the user's message the trace answers: the input_text (last user
--             message) of its earliest llm step that has one, else the root's input_text. A run's
--             user turns are its traces with a user_input that differs from the previous one (an
--             agent whose every model call is a trace of its own gives several traces per turn).
-- Params: none.
-- Output columns: run_key, trace_id, span_id, kind, name, detail, failed, agent, agent_version,
--   scenario, variant_id, replay_index, trace_start, topo_index, start_time_unix_nano,
--   end_time_unix_nano, langgraph_step (node visits), intended_path (JSON text of tracedag.intended_path on the root span or resource),
--   user_input (response rows).
-- Order: run_key, trace_start, trace_id, topo_index (nulls last), start_time_unix_nano, span_id.
with recursive
s as materialized (  -- one read of the columns this query needs
    select trace_id, span_id, parent_span_id, name::varchar as name, service_name::varchar as service_name,
           start_time_unix_nano, end_time_unix_nano, status_code, step_type::varchar as step_type, step_name,
           tool_name, agent_name, input_text, output_text, run_id, conversation_id, scenario_id, variant_id,
           replay_index, service_version, langgraph_node, langgraph_step, graph_node_id,
           attributes['gen_ai.node.name'] as a_node, attributes['tracedag.node.name'] as a_td_node,
           attributes['graph.node.name'] as a_graph_node, attributes['gen_ai.tool.call.arguments'] as a_args,
           coalesce(attributes['tracedag.intended_path'],
                    resource_attributes['tracedag.intended_path']) as intended_path
    from spans
),
roots as (
    select trace_id, span_id, service_name, start_time_unix_nano, input_text, output_text, intended_path
    from s
    where parent_span_id is null
    qualify row_number() over (partition by trace_id order by start_time_unix_nano, span_id) = 1
),
trace_info as materialized (
    select s.trace_id,
           coalesce(max(s.run_id), max(s.conversation_id), s.trace_id) as run_key,
           coalesce(arg_min(s.agent_name, s.start_time_unix_nano) filter (where s.agent_name is not null),
                    any_value(r.service_name), max(s.service_name)) as agent,
           max(s.service_version) as agent_version,
           max(s.scenario_id) as scenario,
           max(s.variant_id) as variant_id,
           max(s.replay_index) as replay_index,
           coalesce(any_value(r.start_time_unix_nano), min(s.start_time_unix_nano)) as trace_start,
           any_value(r.intended_path) as intended_path,
           any_value(r.output_text) as root_output,
           coalesce(min_by(s.input_text, s.start_time_unix_nano)
                        filter (where s.step_type = 'llm' and s.input_text is not null),
                    any_value(r.input_text)) as user_input
    from s
    left join roots r on r.trace_id = s.trace_id
    group by s.trace_id
),
marked as (
    select c.trace_id, c.span_id, c.start_time_unix_nano, c.end_time_unix_nano, c.langgraph_step,
           coalesce(c.langgraph_node, c.a_node, c.a_td_node, c.a_graph_node, c.step_name) as node,
           c.langgraph_node is not null
             and (p.span_id is null or p.langgraph_node is distinct from c.langgraph_node
                  or p.langgraph_step is distinct from c.langgraph_step) as lg_top,
           c.a_node is not null or c.a_td_node is not null or c.a_graph_node is not null
             or c.graph_node_id is not null as other_mark
    from s c
    left join s p on p.trace_id = c.trace_id and p.span_id = c.parent_span_id
    where c.langgraph_node is not null or c.a_node is not null or c.a_td_node is not null
       or c.a_graph_node is not null or c.graph_node_id is not null
),
node_spans as materialized (
    select trace_id, span_id, start_time_unix_nano, end_time_unix_nano, langgraph_step, node
    from marked
    where (lg_top or other_mark) and node not in ('__start__', '__end__')
),
subtree(trace_id, node_span_id, span_id) as (
    select trace_id, span_id, span_id from node_spans
    union all
    select c.trace_id, t.node_span_id, c.span_id
    from subtree t join s c on c.trace_id = t.trace_id and c.parent_span_id = t.span_id
),
bad_spans as (
    select trace_id, span_id from s where status_code = 2
    union
    select trace_id, span_id from step_scores where cast(score as double) <= 2
),
node_failed as (
    select t.trace_id, t.node_span_id, count(b.span_id) > 0 as failed
    from subtree t
    left join bad_spans b on b.trace_id = t.trace_id and b.span_id = t.span_id
    group by t.trace_id, t.node_span_id
),
steps as (
    select n.trace_id, n.span_id, 'node' as kind, n.node as name, null::varchar as detail,
           f.failed, n.start_time_unix_nano, n.end_time_unix_nano, n.langgraph_step, null::varchar as user_input
    from node_spans n
    join node_failed f on f.trace_id = n.trace_id and f.node_span_id = n.span_id
    union all
    select trace_id, span_id, 'tool', coalesce(tool_name, step_name, name),
           coalesce(a_args, input_text), status_code = 2, start_time_unix_nano, end_time_unix_nano, null, null
    from s
    where step_type = 'tool'
    union all
    select s.trace_id, max(s.span_id), 'response', null,
           coalesce(any_value(i.root_output),
                    max_by(s.output_text, s.end_time_unix_nano)
                      filter (where s.output_text is not null and s.step_type in ('llm', 'agent', 'chain'))),
           null, max(s.end_time_unix_nano), max(s.end_time_unix_nano), null, any_value(i.user_input)
    from s join trace_info i on i.trace_id = s.trace_id
    group by s.trace_id
)
select i.run_key, st.trace_id, st.span_id, st.kind, st.name, st.detail, coalesce(st.failed, false) as failed,
       coalesce(i.agent, 'unknown') as agent, i.agent_version, i.scenario, i.variant_id, i.replay_index,
       i.trace_start, d.topo_index, st.start_time_unix_nano, st.end_time_unix_nano, st.langgraph_step,
       i.intended_path, st.user_input
from steps st
join trace_info i on i.trace_id = st.trace_id
left join dag_nodes d on d.trace_id = st.trace_id and d.span_id = st.span_id
order by i.run_key, i.trace_start, st.trace_id, st.kind = 'response', d.topo_index nulls last,
         st.start_time_unix_nano, st.span_id
