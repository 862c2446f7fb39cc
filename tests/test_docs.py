"""The documentation: README is the front door (at most 400 lines, the Quickstart, the example a test
runs), docs/ is a MkDocs site that builds with warnings as errors, its reference names every named
query, TRACEDAG_* variable and command, and every command's help names its page."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tracedag import queries
from tracedag.pipeline.cli import cli
from tracedag.pipeline.commands import _docs

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"
PAGES = DOCS / "pages"
CODE_DIRS = ("collector", "pipeline", "schemas", "queries")
COMMANDS = cli.list_commands(None)  # type: ignore[arg-type]
# what a page must not point at: documents and trackers outside the repository
OUTSIDE = re.compile(r"DESIGN(\.md| §)|RELIABILITY\.md|CONVENTIONS\.md|STYLE\.md|\bissues? #?\d+|#\d{2}\b|\bwave \d")


def _page(name: str) -> str:
    return (PAGES / name).read_text(encoding="utf-8")


def _all_pages() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(PAGES.glob("*.md"))}


def _mkdocs_build(docs: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(docs / "mkdocs.yml"),
                           "--site-dir", str(site)], capture_output=True, text=True, env=env, timeout=300)


# --- README -------------------------------------------------------------------------------------


def test_readme_is_at_most_400_lines():
    assert len(README.splitlines()) <= 400


def test_readme_quickstart_has_exactly_the_two_commands():
    block = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.split("#", 1)[0].strip() for ln in block.strip().splitlines() if ln.strip()]
    assert lines == ["pip install -e . && tracedag demo", 'pip install -e ".[test]" && python -m pytest']


def test_readme_holds_the_example_a_test_runs_verbatim():
    example = (ROOT / "tests" / "demo" / "readme_example.py").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert example in blocks


def test_readme_links_only_to_pages_that_exist_and_to_each_journey_page():
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert links
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, missing
    for page in ("collector.md", "replay.md", "regress.md", "sql.md", "root-causes.md", "dashboards.md"):
        assert f"docs/pages/{page}" in links, page


def test_readme_names_every_command():
    missing = [name for name in COMMANDS if f"tracedag {name}" not in README]
    assert not missing, missing


# --- the site -----------------------------------------------------------------------------------


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    result = _mkdocs_build(DOCS, tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert {p.stem for p in PAGES.glob("*.md")} - {"index"} <= built


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    for i, broken in enumerate(("[gone](no-such-page.md)", "[gone](sql.md#no-such-heading)")):
        docs = tmp_path / f"docs{i}"
        shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("site"))
        with (docs / "pages" / "index.md").open("a", encoding="utf-8") as f:
            f.write(f"\n{broken}\n")
        result = _mkdocs_build(docs, docs / "site")
        assert result.returncode != 0, broken
        assert "no-such" in result.stdout + result.stderr, broken


def test_every_page_is_in_the_navigation():
    config = (DOCS / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [name for name in _all_pages() if f": {name}" not in config]
    assert not missing, missing


def test_no_page_points_outside_the_repository():
    hits = {name: OUTSIDE.findall(text) for name, text in {**_all_pages(), "README.md": README}.items()}
    assert not {k: v for k, v in hits.items() if v}


def test_every_page_citing_a_paper_names_it():
    papers = _page("index.md").split("## Papers the docs cite", 1)[1]
    assert "AgentEval: DAG-Structured Step-Level Evaluation for Agentic Workflows" in " ".join(papers.split())
    for name, text in _all_pages().items():
        if name != "index.md" and re.search(r"\b(AgentEval|EDGE)\b", text):
            assert "index.md#papers-the-docs-cite" in text, name


# --- the reference lives in docs/ ---------------------------------------------------------------


def test_every_named_query_is_in_the_sql_reference():
    sql = _page("sql.md")
    missing = [name for name in queries.names() if f"`{name}`" not in sql]
    assert not missing, missing


def test_every_environment_variable_is_in_the_environment_page():
    found = set()
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            found |= set(re.findall(r"TRACEDAG_[A-Z][A-Z_]*[A-Z](?![A-Z_])", path.read_text(encoding="utf-8")))
    env = _page("environment.md")
    missing = sorted(v for v in found if f"`{v}`" not in env)
    assert not missing, missing


def test_every_command_is_documented_on_its_page():
    assert set(COMMANDS) <= set(_docs.PAGES)
    missing = [name for name in COMMANDS if f"tracedag {name}" not in _page(_docs.PAGES[name])]
    assert not missing, missing


# --- every help names its page ------------------------------------------------------------------


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


@pytest.mark.parametrize("path", _commands(cli), ids=lambda p: " ".join(p) or "tracedag")
def test_every_help_ends_with_an_existing_docs_page(path):
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, (path, result.output)
    last = result.output.strip().splitlines()[-1].strip()
    match = re.fullmatch(r"Docs: (docs/pages/[\w-]+\.md)", last)
    assert match, (path, last)
    assert (ROOT / match.group(1)).is_file(), match.group(1)
    if path:
        assert match.group(1) == _docs.page_path(_docs.PAGES[path[0]])


# --- the architecture page follows the code -----------------------------------------------------


def test_the_architecture_page_names_every_package_and_layer():
    import tomllib

    page = _page("architecture.md")
    packages = sorted(p.parent.name for p in (ROOT / "pipeline").glob("*/__init__.py"))
    assert [p for p in packages if f"`pipeline/{p}/`" not in page] == []
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    modules = [m.strip().removeprefix("tracedag.") for layer in layers for m in layer.split("|")]
    assert [m for m in modules if f"`{m}`" not in page] == []
    assert [c["name"] for c in contracts if c["name"] not in page] == []
