"""The scripted conversations of each framework, with the root cause a person names (fw_capture.Scenario).

The tools (in each ``<framework>_agent.py``) fail deterministically: ``get_weather`` times out for
Atlantis and fails once for Lyon, then answers; ``lookup_order`` answers an unknown order id with an
error payload ``{"status": "error", "error": "order ... not found"}`` instead of raising;
``book_taxi`` rejects a time that is not HH:MM. Classes (issue #30):

- ``tool fails, apology``: the tool fails, the model gives up with an apology (root: the tool);
- ``tool fails, run ends``: the tool's exception ends the run (root: the tool);
- ``retry recovered``: the tool fails once, the model calls it again and it answers (no failure);
- ``error payload``: the tool returns an error payload, no exception (root: the tool);
- ``bad arguments``: the model writes arguments the tool (or the framework, before running it)
  rejects, then apologises or the run ends (root: the model call that wrote them);
- ``clean``: nothing fails;
- ``multi-turn``: two turns, the second fails on its own (root: the tool in turn 2), or a recovered
  retry then a clean turn (no failure), or (Agents SDK, ADK) turn 1's ``lookup_order`` passes with a
  stale tracking number the model quotes, and turn 2's ``track_shipment`` fails on it with a 404
  (root: the producer, turn 1's ``lookup_order``; issue #30 class 5).
"""

from __future__ import annotations

from tests.normalize.frameworks.fw_capture import Reply, Scenario, call, reply


def _smol_final(cid: str, text: str) -> Reply:
    return reply(None, [call(cid, "final_answer", {"answer": text})])


def _smol_tool(cid: str, name: str, args: dict[str, object]) -> Reply:
    return reply(None, [call(cid, name, args)])


SMOL_TOOL = "SimpleTool"  # the span name of a @tool function under openinference-instrumentation-smolagents
SMOL_LLM = "OpenAIModel.generate"


def smolagents_scenarios() -> list[Scenario]:
    """The smolagents conversations (ToolCallingAgent: every answer is a ``final_answer`` tool call)."""
    sorry = "Sorry, I could not get that for you."
    return [
        Scenario("smol-apology", "tool fails, apology", ["Weather in Atlantis?"],
                 [_smol_tool("c1", "get_weather", {"city": "Atlantis"}), _smol_final("c2", sorry)],
                 (1, SMOL_TOOL, 0)),
        Scenario("smol-retry", "retry recovered", ["Weather in Lyon?"],
                 [_smol_tool("c1", "get_weather", {"city": "Lyon"}), _smol_tool("c2", "get_weather", {"city": "Lyon"}),
                  _smol_final("c3", "Lyon: 21C and sunny")], None),
        Scenario("smol-payload", "error payload", ["Where is order B-9?"],
                 [_smol_tool("c1", "lookup_order", {"order_id": "B-9"}), _smol_final("c2", sorry)],
                 (1, SMOL_TOOL, 0)),
        Scenario("smol-badargs", "bad arguments", ["Book a taxi in Paris around six"],
                 [_smol_tool("c1", "book_taxi", {"city": "Paris", "time": "around six"}), _smol_final("c2", sorry)],
                 (1, SMOL_LLM, 0)),
        Scenario("smol-badargs-missing", "bad arguments", ["Book a taxi in Paris"],
                 [_smol_tool("c1", "book_taxi", {"city": "Paris"}), _smol_final("c2", sorry)], (1, SMOL_LLM, 0)),
        Scenario("smol-badargs-fixed", "retry recovered", ["Book a taxi in Paris at six"],
                 [_smol_tool("c1", "book_taxi", {"city": "Paris", "time": "six"}),
                  _smol_tool("c2", "book_taxi", {"city": "Paris", "time": "18:00"}),
                  _smol_final("c3", "Taxi booked at 18:00.")], None),
        Scenario("smol-clean", "clean", ["Weather in Paris?"],
                 [_smol_tool("c1", "get_weather", {"city": "Paris"}), _smol_final("c2", "Paris: 21C and sunny")],
                 None),
        Scenario("smol-clean-order", "clean", ["Where is order A-1001?"],
                 [_smol_tool("c1", "lookup_order", {"order_id": "A-1001"}), _smol_final("c2", "Shipped: TRK-77123")],
                 None),
        Scenario("smol-multi-fail", "multi-turn", ["Weather in Paris?", "And in Atlantis?"],
                 [_smol_tool("c1", "get_weather", {"city": "Paris"}), _smol_final("c2", "Paris: 21C and sunny"),
                  _smol_tool("c3", "get_weather", {"city": "Atlantis"}), _smol_final("c4", sorry)],
                 (2, SMOL_TOOL, 0)),
        Scenario("smol-multi-ok", "multi-turn", ["Weather in Lyon?", "Where is order A-1001?"],
                 [_smol_tool("c1", "get_weather", {"city": "Lyon"}), _smol_tool("c2", "get_weather", {"city": "Lyon"}),
                  _smol_final("c3", "Lyon: 21C and sunny"),
                  _smol_tool("c4", "lookup_order", {"order_id": "A-1001"}), _smol_final("c5", "Shipped: TRK-77123")],
                 None),
    ]


PYAI_LLM = "chat gpt-4o-mini"


def _pyai_tool(cid: str, name: str, args: dict[str, object]) -> Reply:
    return reply(None, [call(cid, name, args)])


def pydantic_ai_scenarios() -> list[Scenario]:
    """The pydantic-ai conversations (the run ends on a text answer; ``ModelRetry`` asks the model again)."""
    sorry = "Sorry, I could not get that for you."
    weather, order = "execute_tool get_weather", "execute_tool lookup_order"
    return [
        Scenario("pyai-raise", "tool fails, run ends", ["Weather in Atlantis?"],
                 [_pyai_tool("c1", "get_weather", {"city": "Atlantis"})], (1, weather, 0)),
        Scenario("pyai-retry", "retry recovered", ["Weather in Lyon?"],
                 [_pyai_tool("c1", "get_weather", {"city": "Lyon"}), _pyai_tool("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny")], None),
        Scenario("pyai-payload", "error payload", ["Where is order B-9?"],
                 [_pyai_tool("c1", "lookup_order", {"order_id": "B-9"}), reply(sorry)], (1, order, 0)),
        Scenario("pyai-badargs", "bad arguments", ["Book a taxi in Paris around six"],
                 [_pyai_tool("c1", "book_taxi", {"city": "Paris", "time": "around six"}), reply(sorry)],
                 (1, PYAI_LLM, 0)),
        Scenario("pyai-badargs-missing", "bad arguments", ["Book a taxi in Paris"],
                 [_pyai_tool("c1", "book_taxi", {"city": "Paris"}), reply(sorry)], (1, PYAI_LLM, 0)),
        Scenario("pyai-badargs-fixed", "retry recovered", ["Book a taxi in Paris at six"],
                 [_pyai_tool("c1", "book_taxi", {"city": "Paris", "time": "six"}),
                  _pyai_tool("c2", "book_taxi", {"city": "Paris", "time": "18:00"}), reply("Taxi booked at 18:00.")],
                 None),
        Scenario("pyai-clean", "clean", ["Weather in Paris?"],
                 [_pyai_tool("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny")], None),
        Scenario("pyai-clean-order", "clean", ["Where is order A-1001?"],
                 [_pyai_tool("c1", "lookup_order", {"order_id": "A-1001"}), reply("Shipped: TRK-77123")], None),
        Scenario("pyai-multi-fail", "multi-turn", ["Weather in Paris?", "And in Atlantis?"],
                 [_pyai_tool("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny"),
                  _pyai_tool("c2", "get_weather", {"city": "Atlantis"})], (2, weather, 0)),
        Scenario("pyai-multi-ok", "multi-turn", ["Weather in Lyon?", "Where is order A-1001?"],
                 [_pyai_tool("c1", "get_weather", {"city": "Lyon"}), _pyai_tool("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny"), _pyai_tool("c3", "lookup_order", {"order_id": "A-1001"}),
                  reply("Shipped: TRK-77123")], None),
    ]


LLX_TOOL, LLX_LLM = "FunctionTool.acall", "OpenAI.achat"


def llama_index_scenarios() -> list[Scenario]:
    """The LlamaIndex conversations (FunctionAgent: a tool's exception goes back to the model as its output)."""
    sorry = "Sorry, I could not get that for you."
    t = _pyai_tool
    return [
        Scenario("llx-apology", "tool fails, apology", ["Weather in Atlantis?"],
                 [t("c1", "get_weather", {"city": "Atlantis"}), reply(sorry)], (1, LLX_TOOL, 0)),
        Scenario("llx-retry", "retry recovered", ["Weather in Lyon?"],
                 [t("c1", "get_weather", {"city": "Lyon"}), t("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny")], None),
        Scenario("llx-payload", "error payload", ["Where is order B-9?"],
                 [t("c1", "lookup_order", {"order_id": "B-9"}), reply(sorry)], (1, LLX_TOOL, 0)),
        Scenario("llx-badargs", "bad arguments", ["Book a taxi in Paris around six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "around six"}), reply(sorry)], (1, LLX_LLM, 0)),
        Scenario("llx-badargs-missing", "bad arguments", ["Book a taxi in Paris"],
                 [t("c1", "book_taxi", {"city": "Paris"}), reply(sorry)], (1, LLX_LLM, 0)),
        Scenario("llx-badargs-fixed", "retry recovered", ["Book a taxi in Paris at six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "six"}),
                  t("c2", "book_taxi", {"city": "Paris", "time": "18:00"}), reply("Taxi booked at 18:00.")], None),
        Scenario("llx-clean", "clean", ["Weather in Paris?"],
                 [t("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny")], None),
        Scenario("llx-clean-order", "clean", ["Where is order A-1001?"],
                 [t("c1", "lookup_order", {"order_id": "A-1001"}), reply("Shipped: TRK-77123")], None),
        Scenario("llx-multi-fail", "multi-turn", ["Weather in Paris?", "And in Atlantis?"],
                 [t("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny"),
                  t("c2", "get_weather", {"city": "Atlantis"}), reply(sorry)], (2, LLX_TOOL, 0)),
        Scenario("llx-multi-ok", "multi-turn", ["Weather in Lyon?", "Where is order A-1001?"],
                 [t("c1", "get_weather", {"city": "Lyon"}), t("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny"), t("c3", "lookup_order", {"order_id": "A-1001"}),
                  reply("Shipped: TRK-77123")], None),
    ]


def strands_scenarios() -> list[Scenario]:
    """The Strands conversations (a tool's exception goes back to the model as an error tool result)."""
    return [_renamed(s, "strands", {LLX_LLM: "chat"}) for s in llama_index_scenarios()]


def _renamed(s: Scenario, prefix: str, names: dict[str, str]) -> Scenario:
    """``s`` for another framework whose agents run the same turns: its conversation id and truth renamed.

    A tool's span is ``execute_tool <name>`` there: the truth names the tool the failing turn called
    (the first call in turn 1, the last one in a later turn).
    """
    truth = s.truth
    if truth is not None:
        turn, name, k = truth
        if name == LLX_TOOL:
            called = [c["function"]["name"] for _, body in s.replies
                      for c in body["choices"][0]["message"].get("tool_calls") or []]
            name = f"execute_tool {called[0] if turn == 1 else called[-1]}"
        else:
            name = names[name]
        truth = (turn, name, k)
    return Scenario(s.conversation.replace("llx", prefix), s.klass, s.turns, s.replies, truth, s.options)


OAI_LLM = "generation"  # the span of a model call under openinference-instrumentation-openai-agents


def openai_agents_scenarios() -> list[Scenario]:
    """The OpenAI Agents SDK conversations (a tool's exception goes to its ``failure_error_function``).

    The SDK's default handler answers the model "An error occurred while running the tool" and leaves
    "Tool execution failed. Error details are redacted." on the tool's span: the bad-argument
    conversations have no error text to read (issue #30 class 3), except ``oai-badargs-shown``, whose
    handler answers the exception's text. ``"tool_errors": "raise"`` (no handler) ends the run.
    """
    sorry = "Sorry, I could not get that for you."
    t, shown = _pyai_tool, {"tool_errors": "shown"}
    return [
        Scenario("oai-apology", "tool fails, apology", ["Weather in Atlantis?"],
                 [t("c1", "get_weather", {"city": "Atlantis"}), reply(sorry)], (1, "get_weather", 0)),
        Scenario("oai-raise", "tool fails, run ends", ["Weather in Atlantis?"],
                 [t("c1", "get_weather", {"city": "Atlantis"})], (1, "get_weather", 0), {"tool_errors": "raise"}),
        Scenario("oai-retry", "retry recovered", ["Weather in Lyon?"],
                 [t("c1", "get_weather", {"city": "Lyon"}), t("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny")], None),
        Scenario("oai-payload", "error payload", ["Where is order B-9?"],
                 [t("c1", "lookup_order", {"order_id": "B-9"}), reply(sorry)], (1, "lookup_order", 0)),
        Scenario("oai-badargs", "bad arguments", ["Book a taxi in Paris around six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "around six"}), reply(sorry)], (1, OAI_LLM, 0)),
        Scenario("oai-badargs-missing", "bad arguments", ["Book a taxi in Paris"],
                 [t("c1", "book_taxi", {"city": "Paris"}), reply(sorry)], (1, OAI_LLM, 0)),
        Scenario("oai-badargs-type", "bad arguments", ["Book a taxi in Paris at 18"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": 18}), reply(sorry)], (1, OAI_LLM, 0)),
        Scenario("oai-badargs-shown", "bad arguments", ["Book a taxi in Paris around six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "around six"}), reply(sorry)], (1, OAI_LLM, 0),
                 shown),
        Scenario("oai-badargs-fixed", "retry recovered", ["Book a taxi in Paris at six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "six"}),
                  t("c2", "book_taxi", {"city": "Paris", "time": "18:00"}), reply("Taxi booked at 18:00.")], None),
        Scenario("oai-clean", "clean", ["Weather in Paris?"],
                 [t("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny")], None),
        Scenario("oai-clean-order", "clean", ["Where is order A-1001?"],
                 [t("c1", "lookup_order", {"order_id": "A-1001"}), reply("Shipped: TRK-77123")], None),
        Scenario("oai-multi-fail", "multi-turn", ["Weather in Paris?", "And in Atlantis?"],
                 [t("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny"),
                  t("c2", "get_weather", {"city": "Atlantis"}), reply(sorry)], (2, "get_weather", 0)),
        Scenario("oai-multi-stale", "multi-turn", ["Where is order A-2002?", "Where is that parcel now?"],
                 [t("c1", "lookup_order", {"order_id": "A-2002"}), reply("Order A-2002 shipped: TRK-31337."),
                  t("c2", "track_shipment", {"tracking_no": "TRK-31337"}), reply(sorry)], (1, "lookup_order", 0)),
        Scenario("oai-multi-ok", "multi-turn", ["Weather in Lyon?", "Where is order A-1001?"],
                 [t("c1", "get_weather", {"city": "Lyon"}), t("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny"), t("c3", "lookup_order", {"order_id": "A-1001"}),
                  reply("Shipped: TRK-77123")], None),
    ]


ADK_LLM = "generate_content openai/gpt-4o-mini"


def google_adk_scenarios() -> list[Scenario]:
    """The Google ADK conversations (a tool's exception ends the run, unless ReflectAndRetryToolPlugin runs).

    With ``"plugin": "reflect_retry"`` a tool's exception becomes the tool's result, the plugin's
    ``ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN`` payload, on a span without an error status (issue
    #30 class 2), up to two retries; the third failure in a row raises and ends the run. ADK answers
    a call that lacks a mandatory argument with an ``{"error": ...}`` result without running the tool.
    """
    sorry = "Sorry, I could not get that for you."
    t, rr = _pyai_tool, {"plugin": "reflect_retry"}
    weather, order = "execute_tool get_weather", "execute_tool lookup_order"
    atlantis = {"city": "Atlantis"}
    return [
        Scenario("adk-raise", "tool fails, run ends", ["Weather in Atlantis?"],
                 [t("c1", "get_weather", atlantis)], (1, weather, 0)),
        Scenario("adk-apology", "tool fails, apology", ["Weather in Atlantis?"],
                 [t("c1", "get_weather", atlantis), reply(sorry)], (1, weather, 0), rr),
        Scenario("adk-retries-exceeded", "tool fails, run ends", ["Weather in Atlantis?"],
                 [t("c1", "get_weather", atlantis), t("c2", "get_weather", atlantis),
                  t("c3", "get_weather", atlantis)], (1, weather, 0), rr),
        Scenario("adk-retry", "retry recovered", ["Weather in Lyon?"],
                 [t("c1", "get_weather", {"city": "Lyon"}), t("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny")], None, rr),
        Scenario("adk-payload", "error payload", ["Where is order B-9?"],
                 [t("c1", "lookup_order", {"order_id": "B-9"}), reply(sorry)], (1, order, 0)),
        Scenario("adk-badargs", "bad arguments", ["Book a taxi in Paris around six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "around six"}), reply(sorry)], (1, ADK_LLM, 0), rr),
        Scenario("adk-badargs-raise", "bad arguments", ["Book a taxi in Paris around six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "around six"})], (1, ADK_LLM, 0)),
        Scenario("adk-badargs-missing", "bad arguments", ["Book a taxi in Paris"],
                 [t("c1", "book_taxi", {"city": "Paris"}), reply(sorry)], (1, ADK_LLM, 0)),
        Scenario("adk-badargs-fixed", "retry recovered", ["Book a taxi in Paris at six"],
                 [t("c1", "book_taxi", {"city": "Paris", "time": "six"}),
                  t("c2", "book_taxi", {"city": "Paris", "time": "18:00"}), reply("Taxi booked at 18:00.")], None, rr),
        Scenario("adk-clean", "clean", ["Weather in Paris?"],
                 [t("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny")], None),
        Scenario("adk-clean-order", "clean", ["Where is order A-1001?"],
                 [t("c1", "lookup_order", {"order_id": "A-1001"}), reply("Shipped: TRK-77123")], None),
        Scenario("adk-multi-fail", "multi-turn", ["Weather in Paris?", "And in Atlantis?"],
                 [t("c1", "get_weather", {"city": "Paris"}), reply("Paris: 21C and sunny"),
                  t("c2", "get_weather", atlantis), reply(sorry)], (2, weather, 0), rr),
        Scenario("adk-multi-stale", "multi-turn", ["Where is order A-2002?", "Where is that parcel now?"],
                 [t("c1", "lookup_order", {"order_id": "A-2002"}), reply("Order A-2002 shipped: TRK-31337."),
                  t("c2", "track_shipment", {"tracking_no": "TRK-31337"})], (1, order, 0)),
        Scenario("adk-multi-ok", "multi-turn", ["Weather in Lyon?", "Book a taxi in Paris at 18:00"],
                 [t("c1", "get_weather", {"city": "Lyon"}), t("c2", "get_weather", {"city": "Lyon"}),
                  reply("Lyon: 21C and sunny"), t("c3", "book_taxi", {"city": "Paris", "time": "18:00"}),
                  reply("Taxi booked at 18:00.")], None, rr),
    ]


BY_FRAMEWORK = {"smolagents": smolagents_scenarios, "pydantic-ai": pydantic_ai_scenarios,
                "llama-index": llama_index_scenarios, "strands": strands_scenarios,
                "openai-agents": openai_agents_scenarios, "google-adk": google_adk_scenarios}
