"""tracedag.instrument: set up OpenTelemetry for a live agent with the attributes tracedag reads.

```python
from tracedag import instrument as td

td.configure("http://127.0.0.1:4318", service_name="my-agent", service_version="1.2.0")
with td.conversation("c-42"), td.run_labels(scenario_id="refund", replay_index=0):
    with td.agent("support"):
        with td.node("answer"), td.llm("gpt-x", provider="openai") as step:
            step.set_output("Here is your refund.", finish_reason="stop")
td.shutdown()
```
"""

from tracedag.instrument.api import USER_MESSAGE_EVENT, agent, llm, node, tool, user_message
from tracedag.instrument.labels import (
    LabelSpanProcessor,
    baggage_labels,
    conversation,
    current_labels,
    propagation_headers,
    run_labels,
)
from tracedag.instrument.recorded import RecordedCall, ToolRecording, recorded_tools
from tracedag.instrument.setup import configure, force_flush, resolve_endpoint, shutdown, tracer
from tracedag.instrument.steps import Step, StepSpec, error_type, messages_json

__all__ = [
    "USER_MESSAGE_EVENT",
    "LabelSpanProcessor",
    "RecordedCall",
    "Step",
    "ToolRecording",
    "StepSpec",
    "agent",
    "baggage_labels",
    "configure",
    "conversation",
    "current_labels",
    "error_type",
    "force_flush",
    "llm",
    "messages_json",
    "node",
    "propagation_headers",
    "recorded_tools",
    "resolve_endpoint",
    "run_labels",
    "shutdown",
    "tool",
    "tracer",
    "user_message",
]
