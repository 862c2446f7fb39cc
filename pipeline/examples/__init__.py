"""tracedag.pipeline.examples."""
