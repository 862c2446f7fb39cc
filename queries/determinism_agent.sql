-- determinism_agent: the determinism table summarized per agent (mean over its scenarios).
-- Inputs: relation determinism (the per-scenario output of determinism.sql plus the response
--   columns response_consistency, response_consistency_method added by
--   tracedag.pipeline.analysis.determinism; written to <data>/tables/determinism/).
-- Params: none.
-- Output columns: agent, agent_version, comparison, scenarios (with a value), runs,
--   node_consistency, node_coverage, action_consistency, action_coverage,
--   action_input_consistency, action_input_coverage, response_consistency (means over scenarios,
--   nulls ignored), response_consistency_method (the methods used, comma separated;
--   token_jaccard_offline_sampled marks an estimate), coverage_estimated (varchar[]: the kinds whose
--   coverage is estimated from sampled pairs in at least one scenario, see determinism.sql).
select agent, agent_version, comparison,
       count(node_consistency) as scenarios,
       sum(runs)::bigint as runs,
       avg(node_consistency) as node_consistency,
       avg(node_coverage) as node_coverage,
       avg(action_consistency) as action_consistency,
       avg(action_coverage) as action_coverage,
       avg(action_input_consistency) as action_input_consistency,
       avg(action_input_coverage) as action_input_coverage,
       avg(cast(response_consistency as double)) as response_consistency,
       string_agg(distinct response_consistency_method, ', ' order by response_consistency_method)
           as response_consistency_method,
       list_sort(list_distinct(flatten(list(coverage_estimated)))) as coverage_estimated
from determinism
group by agent, agent_version, comparison
order by agent, agent_version nulls first, comparison
