"""tracedag.pipeline.analysis."""
