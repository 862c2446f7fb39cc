-- node_utility: how much each agent-graph node is used, per agent, over all its conversations.
-- Inputs: relations run_paths (trajectories.runs_table: agent, agent_version, run_key, ...) and
--   node_visits (trajectories.visits_table: agent, agent_version, run_key, node, failed, ...).
--   (tracedag determinism writes both to <data>/tables/run_paths/ and <data>/tables/node_visits/,
--   so `tracedag query NAME` runs this again over the store.)
-- Definitions: conversation_share = conversations visiting the node / conversations of the agent;
--   visit_share = visits of the node / all node visits of the agent; failures = visits whose
--   subtree has a span with status ERROR or a step score <= 2 (see run_steps.sql).
-- Params: none.
-- Output columns: agent, agent_version, node, conversations, conversation_share, visits,
--   visit_share, visits_per_conversation (among the conversations that visit it), failures,
--   failed_conversations.
with conv as (
    select agent, agent_version, count(*) as n_conv from run_paths group by agent, agent_version
),
tot as (
    select agent, agent_version, count(*) as n_visits from node_visits group by agent, agent_version
)
select v.agent, v.agent_version, v.node,
       count(distinct v.run_key) as conversations,
       count(distinct v.run_key)::double / any_value(c.n_conv) as conversation_share,
       count(*) as visits,
       count(*)::double / any_value(t.n_visits) as visit_share,
       count(*)::double / count(distinct v.run_key) as visits_per_conversation,
       count(*) filter (where v.failed) as failures,
       count(distinct v.run_key) filter (where v.failed) as failed_conversations
from node_visits v
join conv c on c.agent = v.agent and c.agent_version is not distinct from v.agent_version
join tot t on t.agent = v.agent and t.agent_version is not distinct from v.agent_version
group by v.agent, v.agent_version, v.node
order by v.agent, v.agent_version nulls first, conversations desc, visits desc, v.node
