"""tracedag.pipeline.demo.agent: the bundled tennis-court booking agent.

- ``booking_graph``: its graph (router, club info, a re-ask loop for date and time, the calendar
  search, a proposal that branches on the user's yes/no, the booking, finalize) in two variants,
  ``constrained`` and ``permissive`` (every transition allowed), exported in the agent-graph DSL;
- ``fake_llm``: a scripted, seeded, stochastic chat model (no network);
- ``booking_tools``: club info, a faulty calendar (timeouts and HTTP 503 at a seeded rate) and a
  booking system that rejects a booking without a valid slot;
- ``booking_agent``: the agent, instrumented with ``tracedag.instrument`` (one trace per conversation).
"""
