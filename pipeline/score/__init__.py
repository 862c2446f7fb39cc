"""tracedag.pipeline.score."""
