"""tracedag.collector."""
