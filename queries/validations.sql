-- validations: structural validation per run (essential states reached in order), with each scenario's pass rate.
--
-- Inputs:  validations (written by tracedag validate check: one row per run checked against a model)
-- Output:  scenario, run_key, passed, coverage, matched_states, essential_states, missing, out_of_order,
--          explanation, too_slow, failure_paths, run_failed, scenario_runs, scenario_pass_rate, agent,
--          agent_version, model, start_time
-- columns: scenario, run_key, passed, coverage, missing, out_of_order, explanation
-- Params:
--   $scenario     varchar = ''     only this scenario ('' = every scenario)
--   $failed_only  boolean = false  only the runs that did not pass
--
-- scenario_runs / scenario_pass_rate: runs of the row's (model, agent, scenario) and the share of
-- them that passed (runs whose scenario the model lacks, passed null, count in neither). Rows are
-- ordered by scenario, then runs the model has no skeleton for, failing runs, passing runs; then run start.
with v as (
    select *,
           count(passed) over w as scenario_runs,
           avg(case when passed then 1.0 when not passed then 0.0 end) over w as scenario_pass_rate
    from validations
    window w as (partition by model, agent, scenario)
)
select scenario, run_key, passed, coverage, matched_states, essential_states, missing, out_of_order,
       explanation, too_slow, failure_paths, run_failed, scenario_runs, scenario_pass_rate, agent,
       agent_version, model, make_timestamp(start_time_unix_nano // 1000) as start_time
from v
where ($scenario = '' or scenario = $scenario)
  and (not $failed_only or passed is distinct from true)
order by scenario, passed nulls first, start_time_unix_nano, run_key
