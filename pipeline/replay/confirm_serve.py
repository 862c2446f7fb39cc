"""A model step's replacement in a counterfactual check (``tracedag confirm``), for the agent to use.

An agent whose model steps can be replaced asks ``replacement(step_name)`` before calling its model:
inside a check whose root cause is that step it gets the gold output (the same step's output in a
passing run of the same scenario) and returns it instead of calling the model; anywhere else it
gets None. The check is found by the run's ``tracedag.source_conversation_id`` label, so it works
in the replay's worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tracedag.instrument.labels import current_labels

_SOURCE_LABEL = "tracedag.source_conversation_id"
_lock = threading.Lock()
_served: dict[str, dict[str, str]] = {}  # source conversation -> step name -> replacement output


@contextmanager
def serving(conversation_id: str, step_name: str, output: str) -> Iterator[None]:
    """While inside, runs replaying ``conversation_id`` get ``output`` for ``step_name``."""
    with _lock:
        _served.setdefault(conversation_id, {})[step_name] = output
    try:
        yield
    finally:
        with _lock:
            _served.get(conversation_id, {}).pop(step_name, None)


def replacement(step_name: str) -> str | None:
    """The replaced output of model step ``step_name`` in the current check's run, else None."""
    source = current_labels().get(_SOURCE_LABEL)
    if source is None:
        return None
    with _lock:
        return _served.get(str(source), {}).get(step_name)
