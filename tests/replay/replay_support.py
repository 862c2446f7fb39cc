"""Stores of source conversations for the replay tests, written through the real collector."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from tracedag import instrument as td
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.service import CollectorConfig, start_collector

BOOKING_TURNS = ("Hi, I'd like to book a tennis court.", "Saturday.", "At 18:00 please.", "Yes, please book it.")
INFO_TURNS = ("What are your opening hours?",)


def example_store(data: Path, conversations: dict[str, Sequence[str]], fault_rate: float = 0.0) -> Path:
    """Hold ``conversations`` (id -> user turns) with the example agent and store their spans in ``data``."""
    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        td.configure(f"http://127.0.0.1:{collector.http_port}", service_name="court-booking-agent",
                     service_version="1.0", set_global=False, schedule_delay_millis=50)
        try:
            for i, (cid, turns) in enumerate(conversations.items()):
                agent = BookingAgent.create("constrained", random.Random(i), random.Random(100 + i),
                                            fault_rate=fault_rate, latency_scale=0.0)
                with td.conversation(cid):
                    agent.run(list(turns))
            assert td.force_flush(30_000)
        finally:
            td.shutdown()
        collector.flush()
    finally:
        collector.stop()
    return data
