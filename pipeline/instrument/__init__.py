"""tracedag.instrument: set up OpenTelemetry for a live agent with the attributes tracedag reads."""
