"""Named SQL queries: one ``.sql`` file per result, loaded by name."""

from __future__ import annotations

from importlib.resources import files


def load(name: str) -> str:
    """Return the text of ``queries/<name>.sql``."""
    return files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


def names() -> list[str]:
    """Return the names of every bundled query, sorted."""
    return sorted(p.name[:-4] for p in files(__name__).iterdir() if p.name.endswith(".sql"))
