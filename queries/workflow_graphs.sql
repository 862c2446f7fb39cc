-- workflow_graphs: the agent graphs that OpenLLMetry records on its LangGraph spans.
-- Inputs: view spans (attributes gen_ai.workflow.nodes / gen_ai.workflow.edges, JSON strings).
-- Params:
--   $agent  varchar = ''  only spans of this agent_name or service_name ('' = every agent)
-- Output columns: agent, nodes_json, edges_json, spans (how many spans carry this graph),
--   last_seen_unix_nano. Most used graph first.
select coalesce(agent_name, service_name::varchar) as agent,
       attributes['gen_ai.workflow.nodes'] as nodes_json,
       attributes['gen_ai.workflow.edges'] as edges_json,
       count(*) as spans,
       max(start_time_unix_nano) as last_seen_unix_nano
from spans
where attributes['gen_ai.workflow.nodes'] is not null
  and attributes['gen_ai.workflow.edges'] is not null
  and (coalesce($agent, '') = '' or agent_name = $agent or service_name::varchar = $agent)
group by all
order by spans desc, last_seen_unix_nano desc, agent
