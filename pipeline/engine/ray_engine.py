"""The Ray engine: one task per bucket, results back to the driver through Ray's object store.

``init_ray(address, workers)`` joins the cluster at ``address`` (default: the environment's
``RAY_ADDRESS``) or starts a local one of ``workers`` CPUs; ``Engine.map_buckets(fn, items, *args)``
runs ``fn(item, *args)`` as one task per item (rerun up to ``max_retries`` times when its worker
dies) and yields ``(index, result)`` as the tasks finish. A task returns its result and writes
nothing: the driver writes each bucket once, so a rerun task cannot leave duplicate rows.

Ray is imported only here and only when an engine starts (``pip install 'tracedag[ray]'``). The
task functions must be importable on the workers (tracedag installed on every node).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

T = TypeVar("T")

OBJECT_STORE_BYTES = 512 * 1024**2
"""Object store of a local cluster started here: results wait there until the driver writes them
(Ray spills to disk beyond it)."""


class EngineUnavailable(TracedagError):
    """The engine asked for cannot run (Ray not installed, cluster unreachable)."""


def _ray() -> ModuleType:
    try:
        import ray
    except ImportError as exc:
        raise EngineUnavailable("--engine ray needs Ray: pip install 'tracedag[ray]'") from exc
    return ray


def init_ray(address: str | None = None, workers: int | None = None) -> bool:
    """Connect to the Ray cluster at ``address`` (or ``RAY_ADDRESS``), else start a local one of
    ``workers`` CPUs (default: all). Return True when this call started or joined it (False: this
    process was already connected)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _check_reachable(address)
    # an object store's endpoint and credentials go to the tasks (they read the store's spans themselves)
    runtime_env = {"env_vars": {k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    try:
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, runtime_env=runtime_env)
        else:
            ray.init(num_cpus=workers or os.cpu_count() or 1, object_store_memory=OBJECT_STORE_BYTES,
                     include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                     runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise EngineUnavailable(f"cannot start or join the Ray cluster {address or '(local)'}: {exc}") from exc
    return True


def _result(ray: ModuleType, ref: Any, errors: bool) -> Any:
    if not errors:
        return ray.get(ref)
    try:
        return ray.get(ref)
    except Exception as exc:  # the task's own exception, or its worker died (no retry asked)
        return getattr(exc, "cause", None) or exc


def _check_reachable(address: str) -> None:
    """Fail in seconds, with one line, on a ``host:port`` nothing listens on (Ray itself retries for minutes)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto" and other forms: Ray resolves them
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise EngineUnavailable(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from exc


@dataclass
class Engine:
    """A Ray cluster that runs one task per bucket (``--engine ray``).

    ``address``: the cluster (None: ``RAY_ADDRESS``, else a local cluster of ``workers`` CPUs).
    ``tasks`` counts the tasks run, ``started`` whether this engine started the connection
    (``close`` then ends it).
    """

    address: str | None = None
    workers: int | None = None
    max_retries: int = 3
    tasks: int = 0
    started: bool = False

    name = "ray"

    def start(self) -> int:
        """Start or join the cluster; return the number of CPUs tasks can use."""
        self.started = init_ray(self.address, self.workers) or self.started
        return max(1, int(_ray().cluster_resources().get("CPU", 1)))

    def map_buckets(self, fn: Callable[..., Any], items: Sequence[T], *args: Any,
                    retries: int | None = None, errors: bool = False) -> Iterator[tuple[int, Any]]:
        """Run ``fn(item, *args)`` as one Ray task per item; yield ``(index, result)`` as each finishes.

        ``args`` are put in the object store once and shared by every task. A task whose worker
        dies is run again (``retries``, default ``max_retries``); an exception raised by ``fn``
        is not retried and is raised here (with ``retries=0``, a dead worker's too); with ``errors``,
        it is yielded as the item's result instead and the other tasks go on.
        """
        if not items:
            return
        ray = _ray()
        self.start()
        retries = self.max_retries if retries is None else retries
        remote = ray.remote(fn).options(num_cpus=1, max_retries=retries, retry_exceptions=False)
        shared = [ray.put(a) for a in args]
        refs = {remote.remote(item, *shared): i for i, item in enumerate(items)}
        self.tasks += len(refs)
        waiting = list(refs)
        try:
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1)
                for ref in done:
                    yield refs[ref], _result(ray, ref, errors)
        finally:
            for ref in waiting:  # the driver stopped early (an error): stop the rest
                ray.cancel(ref, force=True)

    def close(self) -> None:
        """End the connection this engine started (a local cluster stops with it)."""
        if self.started:
            _ray().shutdown()
            self.started = False
