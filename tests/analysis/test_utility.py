"""Graph utility over a hand-computed store: node/edge utility, transitions per turn, failures,
adherence, convergence and completion; the determinism command end to end; the picture."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tracedag.pipeline.analysis.determinism import analyze
from tracedag.pipeline.cli import cli
from tracedag.schemas.agent_graph import parse_graph, save_graph

GRAPH = parse_graph({
    "name": "booking",
    "nodes": [{"name": n} for n in ("router", "faq", "ask", "book", "human")],
    "edges": [
        {"source": "router", "target": "faq"}, {"source": "router", "target": "ask"},
        {"source": "ask", "target": "ask", "condition": "missing date"},
        {"source": "ask", "target": "book"}, {"source": "ask", "target": "faq"},
        {"source": "ask", "target": "human"},
    ],
    "start": "router",
    "terminals": ["faq", "book", "human"],
})
INTENDED = ["router", "ask", "book"]


def fill(store):
    n = lambda name, failed=False: (name, [], failed)  # noqa: E731
    store.run("c1", "faq", [[n("router"), n("faq")]], replay=0, responses=["we open at 8"])
    store.run("c2", "book", [[n("router"), n("ask")], [n("ask"), n("book")]], replay=0, intended=INTENDED)
    store.run("c3", "book", [[n("router"), n("ask")], [n("book", True)]], replay=1, intended=INTENDED)
    store.run("c4", "faq", [[n("router"), n("faq")], [n("router"), n("ask")]], replay=1)
    store.run("c5", "book", [[n("router"), n("book")]], replay=2, intended=INTENDED)
    return store.write()


@pytest.fixture
def result(store):
    return analyze(fill(store), graphs=[GRAPH])


def _by(rows, *keys):
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def test_node_utility(result):
    nodes = _by(result.tables["node_utility"].to_pylist(), "node")
    assert set(nodes) == {"router", "ask", "faq", "book"}
    assert (nodes["router"]["conversations"], nodes["router"]["visits"]) == (5, 6)
    assert nodes["router"]["conversation_share"] == 1.0
    assert nodes["router"]["visit_share"] == pytest.approx(6 / 15)
    assert (nodes["ask"]["conversations"], nodes["ask"]["visits"]) == (3, 4)
    assert nodes["ask"]["conversation_share"] == pytest.approx(0.6)
    assert nodes["faq"]["conversation_share"] == pytest.approx(0.4)
    assert (nodes["book"]["visits"], nodes["book"]["failures"], nodes["book"]["failed_conversations"]) == (3, 1, 1)
    assert nodes["ask"]["visits_per_conversation"] == pytest.approx(4 / 3)


def test_edge_utility(result):
    edges = _by(result.tables["edge_utility"].to_pylist(), "source", "target")
    assert sum(e["transitions"] for e in edges.values()) == 10
    ra = edges[("router", "ask")]
    assert (ra["transitions"], ra["conversations"]) == (3, 3)
    assert ra["transition_share"] == pytest.approx(0.3)
    assert ra["conversation_share"] == pytest.approx(0.6)
    ab = edges[("ask", "book")]
    assert (ab["transitions"], ab["failures"], ab["cross_turn"]) == (2, 1, 1)
    assert edges[("ask", "ask")]["cross_turn"] == 1
    # faq (terminal) -> router (start) across turns is the graph starting over: allowed
    assert edges[("faq", "router")]["allowed"] is True
    assert edges[("router", "book")]["allowed"] is False


def test_agent_utility(result):
    (row,) = result.tables["agent_utility"].to_pylist()
    assert (row["conversations"], row["turns"], row["node_visits"], row["transitions"]) == (5, 8, 15, 10)
    assert row["transitions_per_turn"] == pytest.approx(10 / 8)
    assert row["adherence"] == pytest.approx(9 / 10)
    assert row["disallowed_transitions"] == 1
    assert row["failed_visits"] == 1
    # c2 completes with a detour (ask twice), c3 follows exactly, c5 skips ask
    assert row["runs_with_intended_path"] == 3
    assert row["convergence_rate"] == pytest.approx(1 / 3)
    assert row["completion_rate"] == pytest.approx(2 / 3)


def test_no_graph_no_adherence(store):
    (row,) = analyze(fill(store)).tables["agent_utility"].to_pylist()
    assert row["adherence"] is None
    assert row["disallowed_transitions"] == 0


def test_picture_shows_utility(result, tmp_path):
    from tracedag.pipeline.analysis.picture import write_pictures

    (path,) = write_pictures(result, tmp_path).values()
    root = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    texts = " ".join(t.text or "" for t in root.iter(f"{ns}text"))
    for word in ("router", "human", "never visited", "Node size", "Edge width", "5 conversations",
                 "adherence 90%", "✗ 1 failed"):
        assert word in texts, word
    circles = {c.find(f"{ns}title").text.split(":")[0]: float(c.get("r"))
               for c in root.iter(f"{ns}circle") if c.find(f"{ns}title") is not None}
    assert circles["router"] > circles["ask"] > circles["faq"] > circles["human"]
    assert circles["ask"] == circles["book"]  # same share of conversations
    # left to right in the order the conversations flow
    cx = {c.find(f"{ns}title").text.split(":")[0]: float(c.get("cx"))
          for c in root.iter(f"{ns}circle") if c.find(f"{ns}title") is not None}
    assert cx["router"] < cx["ask"] < cx["book"]
    assert cx["router"] < cx["faq"]
    paths = {g.find(f"{ns}title").text.split(":")[0]: g.find(f"{ns}path") for g in root.iter(f"{ns}g")
             if g.find(f"{ns}title") is not None}
    assert paths["router → book"].get("stroke") == "#d62728"  # not allowed by the graph
    assert paths["ask → human"].get("stroke-dasharray")  # in the graph, never taken
    widths = {k: float(v.get("stroke-width")) for k, v in paths.items()}
    assert widths["router → ask"] > widths["router → faq"] > widths["ask → ask"]


def test_determinism_command(store, tmp_path):
    data = fill(store)
    gfile = tmp_path / "graph.json"
    save_graph(GRAPH, gfile)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["determinism", "--data", str(data), "--graph", str(gfile),
                                   "--output", str(out)], terminal_width=200)
    assert res.exit_code == 0, res.output
    for title in ("determinism per agent and scenario", "determinism per agent", "node utilization per agent",
                  "offline token-Jaccard"):
        assert title in res.output
    for name in ("determinism", "determinism_agent", "node_utility", "edge_utility", "agent_utility"):
        table = pq.read_table(out / f"{name}.parquet")
        assert table.schema.metadata[b"tracedag.schema"] == f"{name}/v1".encode()
    det = pq.read_table(out / "determinism.parquet").to_pylist()
    book = next(r for r in det if r["scenario"] == "book" and r["comparison"] == "replays")
    # paths: [router ask ask book], [router ask book], [router book] -> ties of 1: shortest wins
    assert book["base_node_path"] == ["router", "book"]
    assert book["node_consistency"] == pytest.approx(1 / 3)
    assert (out / "agent_graph-agentA.svg").exists()
    # default output: <data>/tables/<name>/ and <data>/pictures/
    res = CliRunner().invoke(cli, ["determinism", "--data", str(data)])
    assert res.exit_code == 0, res.output
    assert (data / "tables" / "node_utility" / "node_utility.parquet").exists()
    assert (data / "pictures" / "agent_graph-agentA.svg").exists()


def test_determinism_command_on_an_empty_store(tmp_path):
    (tmp_path / "empty" / "state").mkdir(parents=True)  # a store with nothing in it yet
    res = CliRunner().invoke(cli, ["determinism", "--data", str(tmp_path / "empty")])
    assert res.exit_code == 0, res.output
    assert "no runs found" in res.output


def test_each_agent_uses_its_own_graph(store):
    n = lambda name: (name, [])  # noqa: E731
    store.run("x1", "s", [[n("a"), n("b")]], agent="alpha")
    store.run("y1", "s", [[n("a"), n("b")]], agent="beta")
    data = store.write()
    ab = parse_graph({"name": "alpha", "nodes": [{"name": "a"}, {"name": "b"}],
                      "edges": [{"source": "a", "target": "b"}], "start": "a", "terminals": ["b"]})
    ba = parse_graph({"name": "beta", "nodes": [{"name": "a"}, {"name": "b"}],
                      "edges": [{"source": "b", "target": "a"}], "start": "b", "terminals": ["a"]})
    rows = _by(analyze(data, graphs=[ab, ba]).tables["agent_utility"].to_pylist(), "agent")
    assert rows["alpha"]["adherence"] == 1.0
    assert rows["beta"]["adherence"] == 0.0


def test_named_queries_run_again_over_the_written_tables(store):
    data = fill(store)
    res = CliRunner().invoke(cli, ["determinism", "--data", str(data)])
    assert res.exit_code == 0, res.output
    from tracedag.pipeline.store.querying import run_named

    for name in ("node_utility", "edge_utility", "agent_utility", "determinism_agent"):
        again = run_named(data, name).to_pylist()
        written = pq.read_table(data / "tables" / name / f"{name}.parquet").to_pylist()
        assert again == written, name
    det = run_named(data, "determinism").to_pylist()
    assert [r["node_consistency"] for r in det] == [
        r["node_consistency"] for r in pq.read_table(data / "tables" / "determinism").to_pylist()
    ]
    steps = run_named(data, "run_steps").to_pylist()
    assert {r["kind"] for r in steps} == {"node", "response"}


def test_agent_without_nodes_still_gets_tables_and_a_picture(store, tmp_path):
    store.run("t1", "s", [[]], responses=["hi"])  # a turn with no node and no tool
    result = analyze(store.write())
    (row,) = result.tables["agent_utility"].to_pylist()
    assert (row["conversations"], row["node_visits"], row["transitions"]) == (1, 0, 0)
    from tracedag.pipeline.analysis.picture import write_pictures

    (path,) = write_pictures(result, tmp_path).values()
    assert "1 conversations" in path.read_text()
    ET.parse(path)
