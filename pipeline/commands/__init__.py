"""tracedag.pipeline.commands."""
