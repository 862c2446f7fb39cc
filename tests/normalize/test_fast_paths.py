"""The fast paths of normalization equal the straightforward per-row code (the oracle).

``normalize(base)`` reduces JSON payloads with Arrow kernels for the shapes ``normalize_json``
recognises, keeps plain text as is, reduces each distinct payload once with orjson;
``normalize(base, reference=True)`` runs the per-row reducers on every row with the standard
``json`` module. They must give the same table on the spans captured from the real libraries
and on generated payloads built to sit on the edges of the fast shapes.
"""

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzzing import examples
from tests.realspans import genai_plain_spans, langgraph_spans, openai_spans, to_table
from tracedag.pipeline.normalize import payloads as normalize_json
from tracedag.pipeline.normalize import text as normalize_text
from tracedag.pipeline.normalize.extract import (
    coalesce,
    first_present,
    key_value,
    map_entries,
    on_dictionary,
    pick,
    pick_sparse,
    regex_field,
)
from tracedag.pipeline.normalize.rules import span_keys
from tracedag.pipeline.normalize.spans import clean_name, normalize
from tracedag.schemas.spans import BASE_SCHEMA

REDUCERS = [normalize_text.readable, normalize_text.genai_input, normalize_text.genai_output]


@pytest.fixture(scope="module")
def captured():
    spans = (langgraph_spans().spans + langgraph_spans(dialect="openllmetry").spans + openai_spans(True)
             + openai_spans(False) + genai_plain_spans())
    return to_table(spans).select(BASE_SCHEMA.names).cast(BASE_SCHEMA)


def test_fast_normalize_equals_reference_on_captured_spans(captured):
    fast, ref = normalize(captured), normalize(captured, reference=True)
    assert fast.equals(ref)
    texts = pc.drop_null(fast["input_text"]).to_pylist() + pc.drop_null(fast["output_text"]).to_pylist()
    assert len(texts) > 0.5 * captured.num_rows  # the comparison covers real text, not only nulls


def test_fast_normalize_equals_reference_on_repeated_batches(captured):
    """Replays repeat payloads: reducing each distinct value once must not mix rows up."""
    big = pa.concat_tables([captured] * 7).combine_chunks()
    perm = pa.array([(i * 7919) % big.num_rows for i in range(big.num_rows)])
    shuffled = big.take(perm)
    assert normalize(shuffled).equals(normalize(shuffled, reference=True))


def test_fast_paths_take_the_real_genai_payloads(captured):
    """The openai-v2 message lists of the captures are handled by the Arrow fast paths, not by Python."""
    a = pick(map_entries(captured["attributes"]), span_keys())
    for key, fast in (("gen_ai.input.messages", normalize_json.genai_input),
                      ("gen_ai.output.messages", normalize_json.genai_output)):
        values = pc.drop_null(a[key])
        _, matched = fast(values)
        assert matched.any(), key


def test_pick_equals_per_row_lookup(captured):
    keys = span_keys()
    got = pick(map_entries(captured["attributes"]), keys)
    rows = [dict(m) for m in captured["attributes"].to_pylist()]
    for key in keys:
        assert got[key].to_pylist() == [r.get(key) for r in rows], key


def _reference(values: list[str | None], fn) -> list[str | None]:
    return [None if v is None else fn(v, json.loads) for v in values]


def _check(values: list[str | None]) -> None:
    arr = pa.array(values, pa.string())
    for fn in REDUCERS:
        assert normalize_text.reduce_column(arr, fn).to_pylist() == _reference(values, fn), fn.__name__


# strings on the edges of the fast shapes: separators, quotes, escapes, control and non-ASCII characters
_CLEAN = st.sampled_from(list("ab ,:/{}[]é€😀\u2028") + ["user", "text", "content", "0", "1"])
_EDGY = st.sampled_from(list("a\"\\\n\t\x01\x1f"))
_TEXT = st.lists(st.one_of(_CLEAN, _CLEAN, _CLEAN, _EDGY), max_size=6).map("".join)
_SEPS = [(",", ":"), (", ", ": "), (",", ": "), (" ,", " : ")]
_SEP = st.sampled_from(_SEPS)


def _dump(obj, sep) -> str:
    return json.dumps(obj, separators=sep, ensure_ascii=False)


@st.composite
def message_lists(draw, clean: bool = False) -> str:
    """GenAI message lists: text parts (either key order), tool calls, empty contents, odd keys.

    ``clean`` draws mostly the shapes the fast paths accept (so both sides of their edges are hit).
    """
    text = st.lists(_CLEAN, min_size=1, max_size=6).map("".join) if clean else _TEXT
    kinds = ["text", "text_rev"] * 3 + ["call", "empty"] if clean else ["text", "text_rev", "call", "call_args",
                                                                          "empty", "extra"]

    def part():
        content = draw(text)
        return {
            "text": {"type": "text", "content": content},
            "text_rev": {"content": content, "type": "text"},
            "call": {"type": "tool_call", "name": content, "id": draw(text)},
            "call_args": {"type": "tool_call", "name": content, "id": "c1", "arguments": {"q": content}},
            "empty": {"type": "text", "content": ""},
            "extra": {"type": "text", "content": content, "x": 1},
        }[draw(st.sampled_from(kinds))]

    msgs = []
    for _ in range(draw(st.integers(1, 3))):
        msg = {"role": draw(st.sampled_from(["user", "user", "assistant", "system", "tool"])),
               "parts": [part() for _ in range(draw(st.integers(1, 1 if clean else 2)))]}
        if draw(st.integers(0, 3)) == 0:
            msg["finish_reason"] = draw(text)
        msgs.append(msg)
    return _dump(msgs, draw(st.sampled_from(_SEPS[:3]) if clean else st.sampled_from(_SEPS)))


_SCALAR = st.one_of(_TEXT, st.integers(-(10**20), 10**20), st.sampled_from([0, -0.0, 1.5, 1e300, True, False, None]))


@st.composite
def flat_objects(draw) -> str:
    """Flat objects, with duplicate keys, special keys, single list members, nesting and big integers."""
    keys = draw(st.lists(st.one_of(_TEXT, st.sampled_from(["content", "input", "messages", "ok", "items"])),
                         max_size=4))
    values = [draw(st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.dictionaries(_TEXT, _SCALAR, max_size=2)))
              for _ in keys]
    sep = draw(_SEP)
    members = [f"{_dump(k, sep)}{sep[1]}{_dump(v, sep)}" for k, v in zip(keys, values, strict=True)]
    return "{" + sep[0].join(members) + "}"


_PAYLOAD = st.one_of(
    message_lists(),
    message_lists(clean=True),
    flat_objects(),
    _TEXT,
    st.tuples(st.sampled_from(["", " ", "\u00a0", "\x1f", "\u3000", "\n"]), st.one_of(message_lists(), flat_objects(), _TEXT))
    .map("".join),
    message_lists().map(lambda s: s[: len(s) // 2]),  # cut (invalid) JSON: kept as raw text
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), _PAYLOAD), min_size=1, max_size=12))
def test_reduce_column_equals_per_row_reducers(values):
    _check(values)


def test_reduce_column_edge_cases():
    _check([
        '[{"role":"user","parts":[{"type":"text","content":"hi, there: you"}]}]',
        '[{"role": "user", "parts": [{"content": "text", "type": "text"}]}]',
        '[{"role":"user","parts":[{"type":"text","content":""}]}]',
        '[{"role":"assistant","parts":[{"type":"tool_call","name":"","id":"x"}],"finish_reason":"tool_calls"}]',
        '[{"role":"assistant","parts":[{"type":"text","content":"a\\nb"}]}]',
        '{"a":1,"a":2}', '{"a":-0}', '{"a":12345678901234567890123}', '{"items":["x","y"]}', '{}',
        '{"content":"direct"}', '{"input":"wrapped"}', '{"a":"x","b":[1,2,"c"]}', '{"a":1.50}',
        '{"a": [1, 2]}', '{"a":[]}', '{"a":[],"b":1}', '{"data":1}', '{"x":"content"}', '{"k": "content", "n": null}',
        '{"a": "b", "a": "c"}', '{"a":"b","c":"d"}', '{"a": "b", "c": "d"}', '{"messages": []}',
        "[" * 5000 + "]" * 5000,  # deeper than any parser recursion: raw text, no crash
        '"just a json string"', "plain text", " {\"a\": 1}", "\u00a0[1]",
        None,
    ])


@settings(max_examples=examples(200), deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5)),
                    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=3), kids,
                                                                                        max_size=3)),
                    max_leaves=10))
def test_loads_fast_gives_the_objects_of_json_loads(obj):
    text = json.dumps(obj)
    if any(len(run) >= 19 for run in "".join(c if c.isdigit() else " " for c in text).split()):
        return  # routed to json.loads by reduce_column (orjson turns such integers into floats)
    assert repr(normalize_text.loads_fast(text)) == repr(json.loads(text))


def _cap_reference(texts: list[str | None]) -> tuple[list[str | None], list[bool]]:
    cap = normalize_text.TEXT_CAP
    return ([None if t is None else t[:cap] for t in texts], [t is not None and len(t) > cap for t in texts])


@pytest.mark.parametrize("extra", [-1, 0, 1, 5])
def test_cap_counts_characters_not_bytes(extra):
    cap = normalize_text.TEXT_CAP
    texts = ["é" * (cap + extra), "a" * (cap + extra), "😀" * (cap // 2) + "a" * (cap // 2 + extra), None, "short"]
    got, cut = normalize_text.cap(pa.array(texts, pa.string()))
    assert (got.to_pylist(), cut.to_pylist()) == _cap_reference(texts)


_META_VALUES = {"langgraph_node": r'"(?P<v>(?:[^"\\]|\\.)*)"', "langgraph_step": r"(?P<v>-?\d+)",
                "langgraph_triggers": r"(?P<v>\[[^\]]*\])"}


def _key_value_reference(values, key):
    return regex_field(pa.array(values, pa.string()), f'"{key}":\\s*' + _META_VALUES[key]).to_pylist()


def test_key_value_equals_unanchored_regex_on_captured_metadata(captured):
    meta = pick(map_entries(captured["attributes"]), ["metadata"])["metadata"]
    assert pc.sum(pc.is_valid(meta)).as_py() > 10
    for key, value in _META_VALUES.items():
        assert key_value(meta, key, value).to_pylist() == _key_value_reference(meta.to_pylist(), key), key


_META_PIECES = st.sampled_from(['"langgraph_node"', '"langgraph_node": "a\\"b"', '"langgraph_node":"x"', ": ", '"',
                                '"langgraph_step": 3', '"langgraph_step":-12', '"langgraph_triggers": ["a", "b"]',
                                "[", "]", "{", "}", ", ", "\\", "tools", '"langgraph_node":  \n "y"'])


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(_META_PIECES, max_size=6).map("".join)), min_size=1, max_size=8))
def test_key_value_equals_unanchored_regex(values):
    for key, value in _META_VALUES.items():
        assert key_value(pa.array(values, pa.string()), key, value).to_pylist() == _key_value_reference(values, key)


def test_clean_name_once_per_distinct_name_on_plain_strings():
    names = ["GET /users/123", "GET /users/456", "agent", None, "run 7f3a9c2e-1b2c-4d5e-8f90-123456789abc"]
    plain = on_dictionary(pa.array(names, pa.string()), clean_name).to_pylist()
    assert plain == clean_name(pa.array(names, pa.string())).to_pylist()
    assert plain[:3] == ["GET /users", "GET /users", "agent"]


_MAP_KEYS = st.sampled_from(["input.value", "gen_ai.tool.name", "metadata", "other.key", "session.id"])


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.tuples(_MAP_KEYS, st.sampled_from(["", "a", "ébc", "x" * 40])),
                                               max_size=6)), min_size=1, max_size=10), st.integers(0, 3))
def test_pick_equals_per_row_lookup_with_repeated_keys(maps, offset):
    """Maps with repeated keys (the later entry wins), empty strings, null maps, sliced input."""
    column = pa.array([None] * offset + maps, pa.map_(pa.string(), pa.string())).slice(offset)
    keys = ["input.value", "gen_ai.tool.name", "metadata", "session.id", "absent"]
    got = pick(map_entries(column), keys)
    for key in keys:
        got[key].validate(full=True)
        assert got[key].to_pylist() == [None if m is None else dict(m).get(key) for m in maps], key


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(*[st.sampled_from([None, "", "a", "é€"])] * 3), min_size=1, max_size=12), st.integers(0, 3))
def test_coalesce_skips_nulls_and_empty_strings(rows, offset):
    cols = [pa.array([None] * offset + [r[i] for r in rows], pa.string()).slice(offset) for i in range(3)]
    got = coalesce(*cols)
    got.validate(full=True)
    assert got.to_pylist() == [next((v for v in r if v), None) for r in rows]


def _sparse_as_column(sparse, values, n):
    out = [None] * n
    for row, value in zip(sparse.rows.tolist(), values.take(pa.array(sparse.pos)).to_pylist(), strict=True):
        out[row] = value
    return out


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.tuples(_MAP_KEYS, st.sampled_from(["", "a", "ébc", "x" * 40])),
                                               max_size=6)), min_size=1, max_size=10), st.integers(0, 3))
def test_sparse_sources_equal_picked_columns_coalesced(maps, offset):
    """The text sources read in place (pick_sparse, first_present) equal pick + coalesce."""
    entries = map_entries(pa.array([None] * offset + maps, pa.map_(pa.string(), pa.string())).slice(offset))
    keys = ["input.value", "gen_ai.tool.name", "metadata"]
    dense, sparse = pick(entries, keys), pick_sparse(entries, keys)
    for key in keys:
        assert _sparse_as_column(sparse[key], entries.values, entries.n) == coalesce(dense[key]).to_pylist()
    both = first_present(sparse["metadata"], sparse["input.value"])
    want = coalesce(dense["metadata"], dense["input.value"]).to_pylist()
    assert _sparse_as_column(both, entries.values, entries.n) == want


def test_sparse_sources_on_captured_spans(captured):
    from tracedag.pipeline.normalize.spans import TEXT_KEYS

    entries = map_entries(captured["attributes"])
    dense, sparse = pick(entries, TEXT_KEYS), pick_sparse(entries, TEXT_KEYS)
    for key in TEXT_KEYS:
        assert _sparse_as_column(sparse[key], entries.values, entries.n) == coalesce(dense[key]).to_pylist(), key
