"""The shared capture fixtures (tests/realspans.py) really run the libraries and record ground truth."""

from tests.loopback import openai_client
from tests.realspans import TOPICS, fake_openai_server, langgraph_spans


def test_langgraph_run_has_router_loop_fanout_and_validator_loop():
    cap = langgraph_spans()
    nodes = [(s["step"], s["node"]) for s in cap.steps]
    assert [n for _, n in nodes] == [
        "classify",
        "agent",
        "tools",
        "agent",
        *["write_section"] * len(TOPICS),
        "validator",
        "fixer",
        "validator",
    ]
    fanout_steps = {st for st, n in nodes if n == "write_section"}
    assert len(fanout_steps) == 1  # one super-step: the Send fan-out ran in parallel
    assert all(s["triggers"] == ["__pregel_push"] for s in cap.steps if s["node"] == "write_section")
    assert cap.result["checks"] == 2
    names = [s.name for s in cap.spans]
    assert names.count("agent") == 2 and names.count("lookup_weather") == 1
    assert names.count("write_section") == len(TOPICS)


def test_fake_openai_server_serves_scripted_replies():

    with fake_openai_server(
        [
            (
                200,
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "hi"},
                        }
                    ],
                },
            )
        ]
    ) as srv:
        client = openai_client(srv.base_url, api_key="k", max_retries=0)
        out = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
    assert out.choices[0].message.content == "hi"
    assert srv.requests[0]["messages"][0]["content"] == "hello"
