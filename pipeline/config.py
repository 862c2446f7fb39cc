"""Where the data lives. Constructor argument > environment variable > default."""

from __future__ import annotations

import os
from pathlib import Path

ENV_DATA = "TRACEDAG_DATA"
"""Data directory used when ``--data`` is not given."""

_DEFAULT_DATA = "./tracedag-data"


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the data directory: the argument, then ``TRACEDAG_DATA``, then ``./tracedag-data``."""
    if explicit:
        return Path(explicit)
    return Path(os.environ.get(ENV_DATA) or _DEFAULT_DATA)
