"""tracedag.pipeline.dag."""
