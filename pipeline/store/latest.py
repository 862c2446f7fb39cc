"""The latest build of each trace, as SQL over the raw ``traces_all`` view (one scan of it).

The ``traces`` view keeps the whole latest row of each trace (``arg_max`` over the row); a reader that
needs only which build is the latest aggregates two columns, 2-3x cheaper on 87k traces. Joining it
to another table's files is safe against a garbage collection swap, as the ``dag_nodes`` view is:
``traces_all`` is read once, and live rows are never removed (``store.gc``).
"""

LATEST_BUILDS_SQL = """
select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id
from traces_all group by trace_id
"""
"""``(trace_id, build_id)``: each built trace's latest build (what the ``traces`` view shows)."""

LATEST_CONVERSATIONS_SQL = """
select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id,
       arg_max_null(conversation_id, (built_unix_nano, build_id)) as conversation_id
from traces_all group by trace_id
"""
"""``(trace_id, build_id, conversation_id)``: ``LATEST_BUILDS_SQL`` with the latest build's conversation id (null when
that build has none, as the ``traces`` view shows it: ``arg_max_null``)."""
