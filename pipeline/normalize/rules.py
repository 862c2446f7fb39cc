"""The dialect mapping of normalization, as readable tables.

``step_type`` is decided by the first rule of ``STEP_TYPE_RULES`` that gives a value, in this
priority order:

1. ``gen_ai.operation.name`` (OTel GenAI, also written by OpenLLMetry);
2. ``openinference.span.kind`` (OpenInference);
3. ``traceloop.span.kind`` (OpenLLMetry decorators);
4. ``llm.request.type`` (OpenLLMetry), ``langsmith.span.kind``, ``langfuse.observation.type``;
5. weaker hints: a tool name -> tool, an agent name -> agent, a model/provider/system -> llm;
6. otherwise ``other``.

Then two corrections of known library quirks (see ``normalize.py``): OpenInference's LangChain
tracer types any run whose *name* contains "agent" as AGENT, so inside LangGraph such spans
(the node called ``agent``, a router ``route_agent``) become ``chain``; and the LangGraph graph
run itself becomes ``agent`` (what OpenLLMetry and the GenAI conventions call ``invoke_agent``).
"""

from __future__ import annotations

STEP_TYPES = ("llm", "tool", "agent", "chain", "retriever", "embedding", "guardrail", "evaluator", "other")

# (attribute, {value (lower case): step_type}) in priority order; unknown values fall through.
STEP_TYPE_RULES: list[tuple[str, dict[str, str]]] = [
    (
        "gen_ai.operation.name",
        {
            "chat": "llm",
            "text_completion": "llm",
            "generate_content": "llm",
            "completion": "llm",
            "generate": "llm",
            "llm_request": "llm",
            "embeddings": "embedding",
            "embedding": "embedding",
            "execute_tool": "tool",
            "invoke_agent": "agent",
            "create_agent": "agent",
            "invoke_workflow": "chain",
            "invoke_node": "chain",
            "execute_task": "chain",
            "retrieval": "retriever",
            "vector_db_retrieve": "retriever",
            "rerank": "retriever",
            "evaluate": "evaluator",
            "evaluation": "evaluator",
            "guardrail": "guardrail",
            "apply_guardrail": "guardrail",
        },
    ),
    (
        "openinference.span.kind",
        {
            "llm": "llm",
            "embedding": "embedding",
            "chain": "chain",
            "retriever": "retriever",
            "reranker": "retriever",
            "tool": "tool",
            "agent": "agent",
            "guardrail": "guardrail",
            "evaluator": "evaluator",
            "prompt": "chain",
        },
    ),
    (
        "traceloop.span.kind",
        {"workflow": "chain", "task": "chain", "agent": "agent", "tool": "tool"},
    ),
    (
        "llm.request.type",
        {"chat": "llm", "completion": "llm", "embedding": "embedding", "rerank": "retriever"},
    ),
    (
        "langsmith.span.kind",
        {
            "llm": "llm",
            "chain": "chain",
            "tool": "tool",
            "retriever": "retriever",
            "embedding": "embedding",
            "prompt": "chain",
            "parser": "chain",
        },
    ),
    (
        "langfuse.observation.type",
        {
            "generation": "llm",
            "embedding": "embedding",
            "agent": "agent",
            "tool": "tool",
            "chain": "chain",
            "retriever": "retriever",
            "evaluator": "evaluator",
            "guardrail": "guardrail",
            "span": "chain",
        },
    ),
]

# Span names whose step_type the rules above get wrong, for a known library quirk:
# (RE2 pattern on the span name, the step_type the rules gave, the right step_type, why).
NAME_TYPE_FIXES: list[tuple[str, str, str, str]] = [
    # LlamaIndex agent workflows (OpenInference types every workflow run CHAIN): the agent's run
    (r"^(?:\w+Agent|AgentWorkflow)\.run$", "chain", "agent", "FunctionAgent.run, ReActAgent.run, AgentWorkflow.run"),
    # LlamaIndex's OpenInference instrumentation types the LLM class's request building LLM: no model is called
    (r"\._prepare_chat_with_tools$", "llm", "chain", "OpenAI._prepare_chat_with_tools builds the request"),
    # Strands' loop iteration carries gen_ai.system (the llm hint); its model call is a span of its own
    (r"^execute_event_loop_cycle$", "llm", "chain", "Strands' event loop cycle wraps one model call and its tools"),
]

# Weaker hints: (step_type, attributes whose presence implies it), in priority order.
PRESENCE_HINTS: list[tuple[str, list[str]]] = [
    ("tool", ["gen_ai.tool.name", "tool.name", "gen_ai.tool.call.id"]),
    ("agent", ["gen_ai.agent.name", "agent.name"]),
    ("embedding", ["gen_ai.embeddings.dimension.count", "embedding.model_name"]),
    ("retriever", ["gen_ai.data_source.id", "db.vector.query.top_k"]),
    ("llm", ["gen_ai.request.model", "llm.model_name", "gen_ai.system", "gen_ai.usage.input_tokens"]),
]

# Column <- attributes, first non-empty wins (span attributes).
COLUMN_SOURCES: dict[str, list[str]] = {
    "conversation_id": [
        "gen_ai.conversation.id",
        "session.id",
        "traceloop.association.properties.thread_id",
        "traceloop.association.properties.session_id",
        "traceloop.association.properties.conversation_id",
        # the key traceloop's docs use in their association-properties example ({"user_id", "chat_id"})
        "traceloop.association.properties.chat_id",
        "langsmith.trace.session_id",
        "langfuse.session.id",
        "thread_id",
    ],
    "agent_name": ["gen_ai.agent.name", "agent.name"],
    "tool_name": ["gen_ai.tool.name", "tool.name", "tool_call.function.name"],
    "tool_call_id": ["gen_ai.tool.call.id", "tool_call.id"],
    "model": [
        "gen_ai.request.model",
        "llm.request.model_name",
        "llm.model_name",
        "gen_ai.response.model",
        "llm.response.model_name",
        "embedding.model_name",
    ],
    "provider": ["gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system"],
    "input_tokens": ["gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"],
    "output_tokens": [
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    ],
    "finish_reason": ["gen_ai.response.finish_reasons", "llm.finish_reason", "gen_ai.completion.0.finish_reason"],
    "graph_node_id": ["graph.node.id"],
    "graph_node_parent_id": ["graph.node.parent_id"],
    "node_execution_id": ["gen_ai.node.execution.id"],
    "previous_execution_id": ["gen_ai.node.previous_execution.id"],
    "graph_node_name": ["graph.node.name", "gen_ai.node.name"],
    "entity_name": ["traceloop.entity.name", "gen_ai.task.name"],
    "error_attr": ["error.type"],
    "oi_metadata": ["metadata"],
    "lg_node": ["traceloop.association.properties.langgraph_node"],
    "lg_step": ["traceloop.association.properties.langgraph_step"],
    "lg_triggers": ["traceloop.association.properties.langgraph_triggers"],
    "lg_checkpoint_ns": ["traceloop.association.properties.langgraph_checkpoint_ns"],
    "tool_args": ["gen_ai.tool.call.arguments", "tool_call.function.arguments"],
    "tool_result": ["gen_ai.tool.call.result"],
    "input_messages": ["gen_ai.input.messages"],
    "output_messages": ["gen_ai.output.messages"],
    "input_value": ["input.value"],
    "output_value": ["output.value"],
    "entity_input": ["traceloop.entity.input", "gen_ai.task.input"],
    "entity_output": ["traceloop.entity.output", "gen_ai.task.output"],
}

# Run labels: span attribute first, then resource attribute.
RUN_LABELS: dict[str, str] = {
    "run_id": "tracedag.run_id",
    "scenario_id": "tracedag.scenario_id",
    "replay_index": "tracedag.replay_index",
    "variant_id": "tracedag.variant_id",
}
RESOURCE_KEYS = [*RUN_LABELS.values(), "service.version"]

# Values that mean "no value" for model names (OpenLLMetry writes "unknown" for fake models).
NO_MODEL = ["unknown", "None", "null"]

# Volatile parts removed from span names when they become step names (RE2 syntax).
VOLATILE_PATTERNS = [
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    r"\b0[xX][0-9a-fA-F]+\b",
    r"\b[0-9a-fA-F]{12,}\b",
    r"(^|[\s/#:=,(\[])\d+(\.\d+)?\b",
]


def span_keys() -> list[str]:
    """Every span attribute key normalization reads (one lookup pass picks them all)."""
    keys: list[str] = []
    for attr, _ in STEP_TYPE_RULES:
        keys.append(attr)
    for _, attrs in PRESENCE_HINTS:
        keys.extend(attrs)
    for attrs in COLUMN_SOURCES.values():
        keys.extend(attrs)
    keys.extend(RUN_LABELS.values())
    return list(dict.fromkeys(keys))
