"""DFS path enumeration: counts computed by hand on loops, diamonds and unreachable nodes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tracedag.pipeline.analysis.paths import TooManyPaths, count_paths, enumerate_paths, write_paths
from tracedag.pipeline.cli import cli
from tracedag.schemas.agent_graph import parse_graph


def graph(edges, start="A", terminals=("D",), extra=()):
    names = []
    for s, t in edges:
        for n in (s, t):
            if n not in names:
                names.append(n)
    names += [n for n in extra if n not in names]
    for n in (start, *terminals):
        if n not in names:
            names.append(n)
    return parse_graph({
        "nodes": [{"name": n} for n in names],
        "edges": [{"source": s, "target": t} for s, t in edges],
        "start": start,
        "terminals": list(terminals),
    })


DIAMOND = [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]


def test_diamond_has_two_paths():
    g = graph(DIAMOND)
    assert list(enumerate_paths(g)) == [["A", "B", "D"], ["A", "C", "D"]]


def test_two_diamonds_in_series_multiply():
    # A -> {B, C} -> D -> {E, F} -> G : 2 x 2 = 4
    g = graph(DIAMOND + [("D", "E"), ("D", "F"), ("E", "G"), ("F", "G")], terminals=("G",))
    assert count_paths(g) == 4


@pytest.mark.parametrize(("k", "expected"), [(1, 1), (2, 2), (3, 3)])
def test_loop_bounded_by_max_visits(k, expected):
    # A -> B -> A loop, B -> D exit: the loop can be taken k-1 times
    g = graph([("A", "B"), ("B", "A"), ("B", "D")])
    assert count_paths(g, max_visits=k) == expected


def test_loop_paths_are_explicit():
    g = graph([("A", "B"), ("B", "A"), ("B", "D")])
    assert list(enumerate_paths(g, 2)) == [["A", "B", "A", "B", "D"], ["A", "B", "D"]]


@pytest.mark.parametrize(("k", "expected"), [(1, 1), (2, 2), (4, 4)])
def test_self_loop(k, expected):
    # A -> A (re-ask), A -> D
    g = graph([("A", "A"), ("A", "D")])
    assert count_paths(g, max_visits=k) == expected


def test_loop_inside_diamond():
    # A -> B -> D, A -> C -> D, C -> C. k=1: 2 paths; k=2: adds A C C D -> 3
    g = graph(DIAMOND + [("C", "C")])
    assert count_paths(g, 1) == 2
    assert count_paths(g, 2) == 3


def test_unreachable_nodes_do_not_count():
    # X -> D and X -> Y are unreachable from A
    g = graph(DIAMOND + [("X", "D"), ("X", "Y")], extra=("Z",))
    assert count_paths(g) == 2
    assert all("X" not in p for p in enumerate_paths(g))


def test_terminal_with_outgoing_edges_and_dead_ends():
    # B is terminal but continues to D; C is a dead end (no terminal reachable)
    g = graph([("A", "B"), ("B", "D"), ("A", "C")], terminals=("B", "D"))
    assert list(enumerate_paths(g)) == [["A", "B"], ["A", "B", "D"]]


def test_start_that_is_terminal_and_several_starts():
    g = parse_graph({
        "nodes": [{"name": "A"}, {"name": "B"}],
        "edges": [{"source": "A", "target": "B"}],
        "start": ["A", "B"],
        "terminals": ["A", "B"],
    })
    assert list(enumerate_paths(g)) == [["A"], ["A", "B"], ["B"]]


def test_complete_graph_counts_permutations():
    # complete digraph on A,B,C,D without self loops, start A, terminal D, simple paths:
    # A-D, A-B-D, A-C-D, A-B-C-D, A-C-B-D = 5
    nodes = "ABCD"
    g = graph([(s, t) for s in nodes for t in nodes if s != t])
    assert count_paths(g) == 5


def test_write_paths_jsonl_and_limit(tmp_path):
    g = graph(DIAMOND)
    out = tmp_path / "p.jsonl"
    assert write_paths(g, out) == 2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[1] == {"index": 1, "length": 3, "path": ["A", "C", "D"]}
    with pytest.raises(TooManyPaths):
        write_paths(g, tmp_path / "q.jsonl", limit=1)
    assert not (tmp_path / "q.jsonl").exists()


def test_paths_command(tmp_path):
    gfile = tmp_path / "g.json"
    gfile.write_text(json.dumps(graph([("A", "B"), ("B", "A"), ("B", "D")]).to_dict()))
    out = tmp_path / "paths.jsonl"
    res = CliRunner().invoke(cli, ["paths", str(gfile), "--max-visits", "3", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 paths" in res.output
    assert len(out.read_text().splitlines()) == 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"nodes": [{"name": "A"}], "edges": [{"source": "A", "target": "Q"}],
                               "start": "A", "terminals": ["A"]}))
    res = CliRunner().invoke(cli, ["paths", str(bad)])
    assert res.exit_code != 0
    assert "edge 'A' -> 'Q'" in res.output
