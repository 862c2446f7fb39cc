"""tracedag.pipeline."""
