-- _costs: DuckDB table macros for the price list and what each span's tokens cost (not a named query).
--
-- Loaded by tracedag.pipeline.views.create_views after the views exist. step_stats.sql and the
-- regression gate (tracedag.pipeline.regress.facts, metric cost_usd) call them, so a cost means the
-- same everywhere. Definitions:
--
--   model_prices()
--       the price list: model_key (lower case), input_per_mtok, output_per_mtok, in USD per 1M
--       tokens (public list prices of late 2024/2025).
--   span_costs(p_trace_ids, p_default_input_per_mtok, p_default_output_per_mtok)
--       one row per span of the traces in the list p_trace_ids with input_tokens or output_tokens
--       set: trace_id, span_id, model, input_tokens, output_tokens (a missing side counts 0),
--       input_per_mtok, output_per_mtok (the price of the longest model_key contained in the
--       lower-cased model name; p_default_input_per_mtok / p_default_output_per_mtok when no key
--       matches or the span has no model) and
--       cost_usd = (input_tokens * input_per_mtok + output_tokens * output_per_mtok) / 1e6.
create or replace macro model_prices() as table
select model_key, cast(input_per_mtok as double) as input_per_mtok,
       cast(output_per_mtok as double) as output_per_mtok
from (
    values ('gpt-4o-mini', 0.15, 0.60), ('gpt-4o', 2.50, 10.00), ('gpt-4.1-nano', 0.10, 0.40),
           ('gpt-4.1-mini', 0.40, 1.60), ('gpt-4.1', 2.00, 8.00), ('gpt-3.5-turbo', 0.50, 1.50),
           ('o3-mini', 1.10, 4.40), ('o1', 15.00, 60.00), ('claude-3-5-sonnet', 3.00, 15.00),
           ('claude-3-7-sonnet', 3.00, 15.00), ('claude-sonnet-4', 3.00, 15.00),
           ('claude-3-5-haiku', 0.80, 4.00), ('claude-3-haiku', 0.25, 1.25),
           ('claude-3-opus', 15.00, 75.00), ('gemini-1.5-flash', 0.075, 0.30),
           ('gemini-1.5-pro', 1.25, 5.00), ('gemini-2.0-flash', 0.10, 0.40)
) prices(model_key, input_per_mtok, output_per_mtok);

create or replace macro span_costs(p_trace_ids, p_default_input_per_mtok, p_default_output_per_mtok) as table
with
span_model as (
    select trace_id, span_id, model, coalesce(input_tokens, 0) as input_tokens,
           coalesce(output_tokens, 0) as output_tokens
    from spans
    where (input_tokens is not null or output_tokens is not null)
      and trace_id in (select unnest((case when typeof(p_trace_ids) in ('NULL', '"NULL"') then error('span_costs(): p_trace_ids must be a list of trace ids, e.g. (select list(trace_id) from traces), not NULL') else p_trace_ids end)))
),
model_price as (
    -- the longest price-list name contained in the model name (priced applies the defaults: a
    -- parameter inside this aggregate would not bind in a table macro that calls span_costs)
    select m.model,
           arg_max(p.input_per_mtok, length(p.model_key)) as input_per_mtok,
           arg_max(p.output_per_mtok, length(p.model_key)) as output_per_mtok
    from (select distinct model from span_model where model is not null) m
    left join model_prices() p on contains(lower(m.model), p.model_key)
    group by m.model
),
priced as (
    select s.trace_id, s.span_id, s.model, s.input_tokens, s.output_tokens,
           cast(coalesce(p.input_per_mtok,
                         cast((case when p_default_input_per_mtok is null then error('span_costs(): p_default_input_per_mtok must be a price in USD per 1M tokens, not NULL') else p_default_input_per_mtok end) as double)) as double)
               as input_per_mtok,
           cast(coalesce(p.output_per_mtok,
                         cast((case when p_default_output_per_mtok is null then error('span_costs(): p_default_output_per_mtok must be a price in USD per 1M tokens, not NULL') else p_default_output_per_mtok end) as double)) as double)
               as output_per_mtok
    from span_model s
    left join model_price p on p.model = s.model
)
select trace_id, span_id, model, input_tokens, output_tokens, input_per_mtok, output_per_mtok,
       (input_tokens * input_per_mtok + output_tokens * output_per_mtok) / 1e6 as cost_usd
from priced;
