"""The ids of the tool calls an LLM step's output contains, for ``spans.tool_call_id`` of LLM steps.

A tool step carries the id of the call it runs (``gen_ai.tool.call.id``, ``tool_call.id``); the LLM
step that emitted that call carries it in its output messages, in each dialect that records them:

- OTel GenAI ``gen_ai.output.messages`` (JSON): parts ``{"type": "tool_call", "id": ...}``;
- OpenInference ``llm.output_messages.{i}.message.tool_calls.{j}.tool_call.id``;
- OpenLLMetry / old GenAI indexed ``gen_ai.completion.{i}.tool_calls.{j}.id``.

The ids of one step are joined with ``,`` in output order (``CALL_ID_SEPARATOR``). The DAG build links
each tool step to the LLM step whose ids hold its own (``dag.toolcalls``), an edge of kind
``tool_call``. Only the payloads that mention a tool call are parsed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.normalize.extract import Entries, Sparse, family
from tracedag.pipeline.normalize.text import loads_fast

CALL_ID_SEPARATOR = ","

_OI = r"^llm\.output_messages\.(?P<idx>\d+)\.message\.tool_calls\.\d+\.tool_call\.(?P<field>id)$"
_INDEXED = r"^gen_ai\.completion\.(?P<idx>\d+)\.tool_calls\.\d+\.(?P<field>id)$"


def output_call_ids(messages: Sparse, values: pa.Array, msgs: Entries) -> pa.Array:
    """Per row, the ids of the tool calls in its output (``,``-joined), null when it has none.

    ``messages``: where each row's ``gen_ai.output.messages`` is in ``values``; ``msgs``: the indexed
    message families (``extract.with_prefixes``).
    """
    found: dict[int, list[str]] = {}
    if len(messages.rows):
        texts = values.take(pa.array(messages.pos))
        calls = np.asarray(pc.fill_null(pc.match_substring(texts, '"tool_call"'), False), dtype=bool)
        for row, text in zip(messages.rows[calls].tolist(), texts.filter(pa.array(calls)).to_pylist(), strict=True):
            ids = _genai_ids(text)
            if ids:
                found[row] = ids
    for prefix, pattern in (("llm.output_messages.", _OI), ("gen_ai.completion.", _INDEXED)):
        fam = family(msgs, prefix, pattern)
        if fam.num_rows == 0:
            continue
        for row, value in zip(fam.column("row").to_pylist(), fam.column("value").to_pylist(), strict=True):
            ids = found.setdefault(row, [])
            if value and value not in ids:
                ids.append(value)
    found = {row: ids for row, ids in found.items() if ids}
    if not found:
        return pa.nulls(msgs.n, pa.string())
    out: list[str | None] = [None] * msgs.n
    for row, ids in found.items():
        out[row] = CALL_ID_SEPARATOR.join(i.replace(CALL_ID_SEPARATOR, " ") for i in ids)
    return pa.array(out, pa.string())


def _genai_ids(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        doc: Any = loads_fast(text)
    except ValueError:
        return []
    ids: list[str] = []
    for msg in doc if isinstance(doc, list) else [doc]:
        parts = msg.get("parts") if isinstance(msg, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("type") == "tool_call" and part.get("id"):
                ids.append(str(part["id"]))
    return ids
