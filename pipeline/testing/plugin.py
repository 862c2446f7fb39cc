"""The tracedag pytest plugin (entry point ``pytest11``: loaded by pytest once tracedag is installed).

Markers:
  ``@pytest.mark.invariant(repeats=N)``   the test runs N times and every run must pass;
  ``@pytest.mark.capability(reruns=N)``   the test runs until one run passes, at most N times;
  ``@pytest.mark.tracedag_case("cases/*.json")``  the ``tracedag_case`` fixture, once per file
                                          (paths relative to the test file; globs allowed).
Fixtures:
  ``tracedag_case``  the loaded ``Case`` (``tracedag.testing.load_case``);
  ``judge``          a ``Judge`` from the environment (``TRACEDAG_JUDGE_MODEL`` / ``_BASE_URL`` /
                     ``_API_KEY``, or ``TRACEDAG_JUDGE_SCRIPT=5,4`` offline); skips the test when none.
Export: ``--tracedag-endpoint URL`` (or ``TRACEDAG_TESTING_ENDPOINT``) sends each test as a span
(``tracedag.scenario_id`` = the test id, ``tracedag.run_id`` = the session), the steps run with
``run_step`` as its children, and every eval result (judge grades, the invariant / capability
verdict with the share of passing runs) as a ``gen_ai.evaluation.result`` event, to a tracedag
collector; ``tracedag score`` then puts them in ``step_scores`` like any other evaluation.
Fixtures are set up once per test, not per rerun.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from tracedag.testing.case import Case, load_case
from tracedag.testing.judge import Judge
from tracedag.testing.run import record_evaluation

_EXPORT = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tracedag")
    group.addoption("--tracedag-endpoint", default=os.environ.get("TRACEDAG_TESTING_ENDPOINT"),
                    help="Export test spans and eval results over OTLP/HTTP to this tracedag collector.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "invariant(repeats=N): every one of N runs must pass")
    config.addinivalue_line("markers", "capability(reruns=N): one passing run of at most N is enough")
    config.addinivalue_line("markers", "tracedag_case(*paths): tracedag_case fixture per case file (globs)")
    endpoint = config.getoption("tracedag_endpoint", None)
    if endpoint:
        from tracedag import instrument as td

        td.configure(endpoint, service_name="pytest", service_version=os.environ.get("TRACEDAG_TESTING_VERSION"),
                     set_global=False)
        config.stash[_EXPORT] = f"pytest-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _EXPORT in config.stash:
        from tracedag import instrument as td

        td.force_flush(30_000)
        td.shutdown()


def _case_paths(definition: Any) -> list[Path]:
    marker = definition.get_closest_marker("tracedag_case")
    if marker is None:
        return []
    base = Path(definition.path).parent
    paths: list[Path] = []
    for pattern in marker.args:
        found = sorted(glob.glob(str(base / pattern)))
        if not found:
            raise pytest.UsageError(f"{definition.nodeid}: tracedag_case({pattern!r}) matches no file under {base}")
        paths += [Path(p) for p in found]
    return paths


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tracedag_case" in metafunc.fixturenames:
        paths = _case_paths(metafunc.definition)
        if paths:
            metafunc.parametrize("tracedag_case", paths, ids=[p.stem for p in paths], indirect=True)


@pytest.fixture
def tracedag_case(request: pytest.FixtureRequest) -> Case:
    """The captured case of this test (``@pytest.mark.tracedag_case("case.json")``)."""
    path = getattr(request, "param", None)
    if path is None:
        pytest.fail("tracedag_case needs @pytest.mark.tracedag_case('path/to/case.json') on the test")
    return load_case(path)


@pytest.fixture
def judge() -> Judge:
    """The judge the environment configures (skips the test when there is none)."""
    found = Judge.from_env()
    if found is None:
        pytest.skip("no judge configured: set TRACEDAG_JUDGE_MODEL (and _BASE_URL, _API_KEY) or TRACEDAG_JUDGE_SCRIPT")
    return found


def _test_span(item: pytest.Item) -> AbstractContextManager[Any]:
    run_id = item.config.stash.get(_EXPORT, None)
    if run_id is None:
        return nullcontext()
    from tracedag import instrument as td

    class _Span:
        def __enter__(self) -> Any:
            self._labels = td.run_labels(run_id=run_id, scenario_id=item.nodeid)
            self._labels.__enter__()
            self._node = td.node(f"test {item.name}")
            return self._node.__enter__()

        def __exit__(self, *exc: Any) -> None:
            self._node.__exit__(*exc)
            self._labels.__exit__(*exc)

    return _Span()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _test_span(item):
        yield


def _caller(item: pytest.Function) -> Callable[[], Any]:
    names = item._fixtureinfo.argnames
    args = {name: item.funcargs[name] for name in names}
    return lambda: item.obj(**args)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    invariant = pyfuncitem.get_closest_marker("invariant")
    capability = pyfuncitem.get_closest_marker("capability")
    if invariant is None and capability is None:
        return None
    if invariant is not None and capability is not None:
        raise pytest.UsageError(f"{pyfuncitem.nodeid}: invariant and capability exclude each other")
    call = _caller(pyfuncitem)
    if invariant is not None:
        _invariant(call, _count(invariant, "repeats"))
    else:
        assert capability is not None
        _capability(call, _count(capability, "reruns"))
    return True


def _count(marker: pytest.Mark, key: str) -> int:
    value = marker.kwargs.get(key, marker.args[0] if marker.args else 3)
    if not isinstance(value, int) or value < 1:
        raise pytest.UsageError(f"@pytest.mark.{marker.name}({key}=...) needs a positive integer, got {value!r}")
    return value


def _invariant(call: Callable[[], Any], repeats: int) -> None:
    for i in range(repeats):
        try:
            call()
        except Exception as e:
            record_evaluation("invariant", i / repeats, "fail", f"run {i + 1} of {repeats} failed: {e}")
            raise AssertionError(f"invariant: run {i + 1} of {repeats} failed: {e}") from e
    record_evaluation("invariant", 1.0, "pass", f"all {repeats} runs passed")


def _capability(call: Callable[[], Any], reruns: int) -> None:
    errors: list[Exception] = []
    for i in range(reruns):
        try:
            call()
        except Exception as e:
            errors.append(e)
            continue
        record_evaluation("capability", 1.0, "pass", f"run {i + 1} of at most {reruns} passed")
        return
    record_evaluation("capability", 0.0, "fail", f"none of {reruns} runs passed: {errors[-1]}")
    raise AssertionError(f"capability: none of {reruns} runs passed; last: {errors[-1]}") from errors[-1]
