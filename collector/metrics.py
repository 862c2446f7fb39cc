"""A small thread-safe metrics registry rendered as Prometheus text (``GET /metrics``).

``REGISTRY`` is shared by everything in the process: the receivers, the spool writer and the
spool->Parquet converter register their metrics there with ``REGISTRY.counter(...)`` etc.
(get-or-create by name, so modules can call it at import time).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Sequence

LabelValues = tuple[str, ...]


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_text(names: Sequence[str], values: LabelValues, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> LabelValues:
        return tuple(str(labels.get(n, "")) for n in self.labelnames)

    def samples(self) -> list[str]:
        """Return the sample lines of this metric."""
        raise TypeError(f"{type(self).__name__} has no samples")

    def render(self) -> str:
        """Return the HELP, TYPE and sample lines."""
        head = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        return "\n".join(head + self.samples())


class Counter(_Metric):
    """A monotonically increasing count, optionally by labels."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[LabelValues, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to the series with these labels."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        """Return the current value of one series."""
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        """Return the sample lines."""
        with self._lock:
            items = sorted(self._values.items())
        if not items and not self.labelnames:
            items = [((), 0.0)]
        return [f"{self.name}{_label_text(self.labelnames, k)} {_fmt(v)}" for k, v in items]


class Gauge(_Metric):
    """A value that goes up and down; set directly or read from a callback at render time."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._values: dict[LabelValues, float] = {}
        self._callback: Callable[[], float] | None = None

    def set(self, value: float, **labels: str) -> None:
        """Set the series with these labels."""
        with self._lock:
            self._values[self._key(labels)] = value

    def set_function(self, callback: Callable[[], float]) -> None:
        """Read the (unlabelled) value from ``callback`` whenever metrics are rendered."""
        self._callback = callback

    def value(self, **labels: str) -> float:
        """Return the current value of one series."""
        if self._callback is not None and not self.labelnames:
            return self._callback()
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        """Return the sample lines."""
        if self._callback is not None and not self.labelnames:
            return [f"{self.name} {_fmt(self._callback())}"]
        with self._lock:
            items = sorted(self._values.items()) or ([((), 0.0)] if not self.labelnames else [])
        return [f"{self.name}{_label_text(self.labelnames, k)} {_fmt(v)}" for k, v in items]


DEFAULT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Histogram(_Metric):
    """Observations counted in cumulative buckets (unlabelled)."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        super().__init__(name, help_text)
        self.buckets = tuple(sorted(buckets))
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        i = bisect.bisect_left(self.buckets, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def count(self) -> int:
        """Return the number of observations."""
        with self._lock:
            return sum(self._counts)

    def samples(self) -> list[str]:
        """Return the bucket, sum and count lines."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        lines, running = [], 0
        for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
            running += n
            lines.append(f'{self.name}_bucket{{le="{_fmt(bound)}"}} {running}')
        lines += [f"{self.name}_sum {_fmt(total)}", f"{self.name}_count {running}"]
        return lines


class Registry:
    """Named metrics, created on first use and rendered together."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()
        self._sources: list[Callable[[], str]] = []

    def add_source(self, source: Callable[[], str]) -> None:
        """Also render the metric families of ``source()`` (Prometheus text, e.g. from a child process)."""
        with self._lock:
            self._sources.append(source)

    def remove_source(self, source: Callable[[], str]) -> None:
        """Stop rendering ``source``."""
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)

    def _get(self, name: str, factory: Callable[[], _Metric]) -> _Metric:
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = self._metrics[name] = factory()
            return metric

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        """Return the counter ``name``, creating it on first use."""
        metric = self._get(name, lambda: Counter(name, help_text, labelnames))
        if not isinstance(metric, Counter):
            raise TypeError(f"metric {name} is a {metric.kind}, not a counter")
        return metric

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        """Return the gauge ``name``, creating it on first use."""
        metric = self._get(name, lambda: Gauge(name, help_text, labelnames))
        if not isinstance(metric, Gauge):
            raise TypeError(f"metric {name} is a {metric.kind}, not a gauge")
        return metric

    def histogram(self, name: str, help_text: str, buckets: Sequence[float] = DEFAULT_BUCKETS) -> Histogram:
        """Return the histogram ``name``, creating it on first use."""
        metric = self._get(name, lambda: Histogram(name, help_text, buckets))
        if not isinstance(metric, Histogram):
            raise TypeError(f"metric {name} is a {metric.kind}, not a histogram")
        return metric

    def render(self) -> str:
        """Return every metric in the Prometheus text exposition format."""
        with self._lock:
            metrics = sorted(self._metrics.values(), key=lambda m: m.name)
            sources = list(self._sources)
        own = {m.name for m in metrics}
        text = "\n".join(m.render() for m in metrics) + "\n"
        for source in sources:
            text += foreign_families(source(), own)
        return text


def foreign_families(text: str, skip: set[str]) -> str:
    """Return the metric families of ``text`` whose names are not in ``skip``."""
    out: list[str] = []
    keep = False
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            keep = name not in skip
            if keep:
                skip.add(name)
        if keep and line:
            out.append(line)
    return "\n".join(out) + "\n" if out else ""


REGISTRY = Registry()
