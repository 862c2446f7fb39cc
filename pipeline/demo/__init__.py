"""``tracedag demo``: its stages, its report, the simulator and the bundled example agent."""
