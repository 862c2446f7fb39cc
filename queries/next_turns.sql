-- next_turns: next-turn suggestions (EDGE §4.2): from a conversation state (the node it is at), the nodes it most likely goes to next, by edge utility.
-- Inputs: relation node_visits (trajectories.visits_table; tracedag determinism writes it to
--   <data>/tables/node_visits/, so `tracedag query next_turns` runs over the store).
-- Definitions: a state is a node; its suggestions are the observed transitions out of it (a visit
--   and the next visit of the same run, parallel branches excluded, as edge_utility counts them),
--   per agent and version. probability = transitions to next_node / all transitions out of the
--   state; success_rate = 1 - failures / transitions (failures: the next visit failed);
--   cross_turn = transitions where the next node is reached in a later turn (a new user message).
--   rank 1 is the most used; ties go to fewer failures, then next_node's name.
-- Params:
--   $node           varchar  = ''     only this state ('' = every state)
--   $agent          varchar  = ''     only this agent ('' = every agent)
--   $cross_turn_only boolean = false  only transitions into the next user turn
--   $top            integer  = 3      suggestions per state (0 = all)
-- Output columns: agent, agent_version, state, rank, next_node, probability, transitions,
--   conversations, failures, success_rate, cross_turn.
with tr as (
    select agent, agent_version, run_key, node as state, next_node, coalesce(next_failed, false) as next_failed,
           coalesce(next_turn <> turn, false) as cross_turn
    from node_visits
    where next_node is not null and not coalesce(parallel, false)
      and ($node = '' or node = $node) and ($agent = '' or agent = $agent)
      and (not $cross_turn_only or coalesce(next_turn <> turn, false))
),
agg as (
    select agent, agent_version, state, next_node, count(*) as transitions,
           count(distinct run_key) as conversations, count(*) filter (where next_failed) as failures,
           count(*) filter (where cross_turn) as cross_turn
    from tr
    group by agent, agent_version, state, next_node
),
ranked as (
    select *,
           transitions::double / sum(transitions) over (partition by agent, agent_version, state) as probability,
           row_number() over (partition by agent, agent_version, state
                              order by transitions desc, failures, next_node) as rank
    from agg
)
select agent, agent_version, state, rank, next_node, probability, transitions, conversations, failures,
       1 - failures::double / transitions as success_rate, cross_turn
from ranked
where $top <= 0 or rank <= $top
order by agent, agent_version nulls first, state, rank
