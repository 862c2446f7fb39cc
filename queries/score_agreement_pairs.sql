-- score_agreement_pairs: each human-labelled step paired with each automatic source's score of it.
--
-- Inputs:  views human_labels (latest label per trace, span, metric, annotator counts) and
--          step_scores (latest builds; rows of source 'human' are left out here).
-- Params:  $metric  varchar or NULL. NULL compares a step's lowest score over all metrics on each
--                   side (the step's verdict); a metric name compares that metric only.
-- Output:  source varchar (rule | evaluation | judge), trace_id, span_id,
--          human_score double (mean over annotators per metric, then lowest over metrics),
--          source_score double (lowest score of that source on the step),
--          human_l3 varchar (taxonomy_l3 of the human label with the lowest score, when given),
--          source_l1 varchar (taxonomy_l1 of the source's lowest-scoring row, set when it failed).
with latest as (
    select trace_id, span_id, metric, annotator, score, taxonomy_l3 from human_labels
    where score is not null and (cast($metric as varchar) is null or metric = cast($metric as varchar))
    qualify row_number() over (
        partition by trace_id, span_id, metric, annotator order by imported_unix_nano desc) = 1
), per_metric as (
    select trace_id, span_id, metric, avg(cast(score as double)) as score,
           arg_min(taxonomy_l3, cast(score as double)) as l3
    from latest group by all
), human as (
    select trace_id, span_id, min(score) as human_score, arg_min(l3, score) as human_l3
    from per_metric group by all
), auto as (
    select source, trace_id, span_id, min(cast(score as double)) as source_score,
           arg_min(taxonomy_l1, cast(score as double)) as source_l1
    from step_scores
    where source <> 'human' and score is not null
      and (cast($metric as varchar) is null or metric = cast($metric as varchar))
    group by all
)
select a.source, h.trace_id, h.span_id, h.human_score, a.source_score, h.human_l3, a.source_l1
from human h join auto a on a.trace_id = h.trace_id and a.span_id = h.span_id
order by a.source, h.trace_id, h.span_id
