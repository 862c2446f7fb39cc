-- edge_utility: how much each observed node transition is used, per agent, over all conversations.
-- Inputs: relations run_paths (trajectories.runs_table) and node_visits (trajectories.visits_table; a
--   transition is a visit with its next_node, across turns too).
--   (tracedag determinism writes both to <data>/tables/run_paths/ and <data>/tables/node_visits/,
--   so `tracedag query NAME` runs this again over the store.)
-- Definitions: a transition is a visit and the next visit of the run, unless the next one is a
--   parallel branch of it (node_visits.parallel); conversation_share = conversations with the transition / conversations of the agent;
--   transition_share = its transitions / all transitions of the agent; failures = transitions
--   into a failed visit of the target; cross_turn = transitions whose target is in a later turn;
--   allowed = whether the agent graph (--graph) declares it (null without a graph).
-- Params: none.
-- Output columns: agent, agent_version, source, target, conversations, conversation_share,
--   transitions, transition_share, failures, cross_turn, allowed.
with conv as (
    select agent, agent_version, count(*) as n_conv from run_paths group by agent, agent_version
),
tr as (
    select * from node_visits where next_node is not null and not coalesce(parallel, false)
),
tot as (
    select agent, agent_version, count(*) as n_tr from tr group by agent, agent_version
)
select e.agent, e.agent_version, e.node as source, e.next_node as target,
       count(distinct e.run_key) as conversations,
       count(distinct e.run_key)::double / any_value(c.n_conv) as conversation_share,
       count(*) as transitions,
       count(*)::double / any_value(t.n_tr) as transition_share,
       count(*) filter (where e.next_failed) as failures,
       count(*) filter (where e.next_turn <> e.turn) as cross_turn,
       bool_and(e.allowed) as allowed
from tr e
join conv c on c.agent = e.agent and c.agent_version is not distinct from e.agent_version
join tot t on t.agent = e.agent and t.agent_version is not distinct from e.agent_version
group by e.agent, e.agent_version, e.node, e.next_node
order by e.agent, e.agent_version nulls first, transitions desc, source, target
