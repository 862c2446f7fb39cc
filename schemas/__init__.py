"""tracedag.schemas."""
