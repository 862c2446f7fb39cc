"""The failure taxonomy (``schemas/taxonomy.yaml``): three levels, looked up by the L3 category."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any

import yaml

logger = logging.getLogger(__name__)

UNCLASSIFIED = "unclassified"


@dataclass(frozen=True)
class Category:
    """One leaf (L3) of the taxonomy with its ancestors."""

    l1: str
    l2: str
    l3: str
    definition: str


@dataclass(frozen=True)
class Taxonomy:
    """The loaded taxonomy: its version and every L3 leaf by id."""

    version: str
    leaves: dict[str, Category]

    def classify(self, l3: str | None) -> Category | None:
        """Return the leaf called ``l3``, or None when there is no such category."""
        if not l3:
            return None
        return self.leaves.get(l3.strip().lower())

    def unclassified(self) -> Category:
        """The category of a failure that fits nowhere (all three levels ``unclassified``)."""
        return Category(UNCLASSIFIED, UNCLASSIFIED, UNCLASSIFIED, "no category fits the available signal")


def _leaves(doc: dict[str, Any]) -> dict[str, Category]:
    out: dict[str, Category] = {}
    for c1 in doc["categories"]:
        for c2 in c1["children"]:
            for c3 in c2["children"]:
                if c3["id"] in out:
                    raise ValueError(f"taxonomy: duplicate L3 id {c3['id']}")
                out[c3["id"]] = Category(c1["id"], c2["id"], c3["id"], c3["definition"])
    return out


@lru_cache(maxsize=1)
def load_taxonomy() -> Taxonomy:
    """Load the bundled ``schemas/taxonomy.yaml``."""
    text = files("tracedag.schemas").joinpath("taxonomy.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    return Taxonomy(version=str(doc["version"]), leaves=_leaves(doc))


def taxonomy_document() -> dict[str, Any]:
    """Return the raw taxonomy document (levels, definitions, examples)."""
    text = files("tracedag.schemas").joinpath("taxonomy.yaml").read_text(encoding="utf-8")
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc
