"""OTLP ``AnyValue`` -> the text stored in the ``attributes`` maps.

Strings as they are, booleans as ``true``/``false``, numbers in their decimal form, bytes as
base64 (as in OTLP/JSON), arrays and key-value lists as JSON.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def any_value_text(v: AnyValue) -> str:
    """Return the text form of an OTLP ``AnyValue``."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which is None:
        return ""
    if which in ("array_value", "kvlist_value"):
        return json.dumps(_any_value_json(v), ensure_ascii=False, separators=(",", ":"))
    return str(_any_value_json(v))


def _any_value_json(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "bool_value":
        return "true" if v.bool_value else "false"
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    if which == "array_value":
        return [_any_value_json(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value_json(kv.value) for kv in v.kvlist_value.values}
    return None


def attributes_text(attrs: Iterable[KeyValue]) -> tuple[list[tuple[str, str]], bool]:
    """Return the attributes as (key, text) pairs, last duplicate winning, and whether keys repeated."""
    out: dict[str, str] = {}
    dup = False
    for kv in attrs:
        if kv.key in out:
            dup = True
        out[kv.key] = any_value_text(kv.value)
    return list(out.items()), dup
