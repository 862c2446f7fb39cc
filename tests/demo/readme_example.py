from tracedag import instrument as td

td.configure(service_name="support-bot", service_version="1.2.0")  # OTLP/HTTP to 127.0.0.1:4318

@td.tool("lookup_order")
def lookup_order(order_id: str) -> dict:
    return {"order_id": order_id, "status": "shipped"}

labels = td.run_labels(scenario_id="where-is-my-order", replay_index=0)
with td.conversation("conv-42"), labels, td.agent("support"), td.node("answer"):
    order = lookup_order("A-17")
    with td.llm("gpt-4o-mini", provider="openai", input_messages=["Where is my order A-17?"]) as step:
        step.set_output(f"Your order A-17 is {order['status']}.", finish_reason="stop")
        step.set_usage(input_tokens=42, output_tokens=9)
td.shutdown()
