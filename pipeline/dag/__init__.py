"""tracedag.pipeline.dag: execution DAG reconstruction (``build_store``, ``reconstruct``)."""

from tracedag.pipeline.dag.build import BuildStats, build_store
from tracedag.pipeline.dag.reconstruct import reconstruct

__all__ = ["BuildStats", "build_store", "reconstruct"]
