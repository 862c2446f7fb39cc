-- agent_utility: graph-level figures per agent over all its conversations.
-- Inputs: relations run_paths (trajectories.runs_table) and node_visits (trajectories.visits_table).
--   (tracedag determinism writes both to <data>/tables/run_paths/ and <data>/tables/node_visits/,
--   so `tracedag query NAME` runs this again over the store.)
-- Definitions: transitions_per_turn = node transitions / turns (a transition may cross a turn;
--   a step into a parallel branch is not one, see edge_utility.sql);
--   adherence = share of transitions the agent graph allows (null without --graph);
--   completion_rate = share of runs carrying tracedag.intended_path whose node path contains the
--   intended path in order (detours and backtracking allowed); convergence_rate = share of those
--   runs whose node path equals the intended path (followed without backtracking).
-- Params: none.
-- Output columns: agent, agent_version, conversations, turns, node_visits, transitions,
--   transitions_per_turn, failed_visits, adherence, disallowed_transitions,
--   runs_with_intended_path, convergence_rate, completion_rate.
with r as (
    select agent, agent_version, count(*) as conversations, sum(turns)::bigint as turns,
           count(intended_path) as runs_with_intended_path,
           avg(case when converged then 1.0 else 0.0 end) filter (where intended_path is not null) as convergence_rate,
           avg(case when completed then 1.0 else 0.0 end) filter (where intended_path is not null) as completion_rate
    from run_paths group by agent, agent_version
),
v as (
    select agent, agent_version, count(*) as node_visits,
           count(next_node) filter (where not coalesce(parallel, false)) as transitions,
           count(*) filter (where failed) as failed_visits,
           avg(case when allowed then 1.0 else 0.0 end) filter (where allowed is not null) as adherence,
           count(*) filter (where allowed = false) as disallowed_transitions
    from node_visits group by agent, agent_version
)
select r.agent, r.agent_version, r.conversations, r.turns,
       coalesce(v.node_visits, 0) as node_visits, coalesce(v.transitions, 0) as transitions,
       coalesce(v.transitions, 0)::double / nullif(r.turns, 0) as transitions_per_turn,
       coalesce(v.failed_visits, 0) as failed_visits, v.adherence,
       coalesce(v.disallowed_transitions, 0) as disallowed_transitions,
       r.runs_with_intended_path, r.convergence_rate, r.completion_rate
from r left join v on v.agent = r.agent and v.agent_version is not distinct from r.agent_version
order by r.agent, r.agent_version nulls first
