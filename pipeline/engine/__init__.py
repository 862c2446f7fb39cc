"""tracedag.pipeline.engine: run a stage's pure function once per bucket on a distributed engine.

``Engine`` is a Ray cluster (``--engine ray``; Ray is imported only then); ``plan_buckets`` cuts
the traces of a plan into buckets, each a received-time range × trace-id range
(``tracedag.pipeline.engine.buckets``). The stages (``dag``, ``score``, ``replay``) pass their own
task function; results come back to the driver, which writes them under deterministic names.
"""

from tracedag.pipeline.engine.buckets import Bucket, bucket_target, plan_buckets
from tracedag.pipeline.engine.ray_engine import Engine, EngineUnavailable, init_ray

__all__ = ["Bucket", "Engine", "EngineUnavailable", "bucket_target", "init_ray", "plan_buckets"]
