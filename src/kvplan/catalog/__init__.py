"""Bundled Hugging Face ``config.json`` files, so ``kvplan inspect ORG/NAME`` works offline.

Each model lives in ``<org>__<name>/config.json`` beside this file; ``PROVENANCE.md`` says
where each file comes from and which are reconstructions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CATALOG_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class CatalogEntry:
    """One bundled model."""

    model_id: str
    """The Hugging Face id, ``org/name``."""
    path: Path
    """The directory holding ``config.json``."""

    @property
    def slug(self) -> str:
        """The directory name, ``org__name``."""
        return self.path.name


def entries() -> list[CatalogEntry]:
    """Every bundled model, sorted by id (case-insensitively)."""
    found = [
        CatalogEntry(model_id=child.name.replace("__", "/", 1), path=child)
        for child in CATALOG_DIR.iterdir()
        if child.is_dir() and (child / "config.json").is_file()
    ]
    return sorted(found, key=lambda entry: entry.model_id.lower())


def lookup(name: str) -> CatalogEntry | None:
    """The entry called ``name``: ``org/name``, ``org__name`` or just ``name`` (any case)."""
    key = name.strip().strip("/").lower()
    for entry in entries():
        candidates = {
            entry.model_id.lower(),
            entry.slug.lower(),
            entry.model_id.split("/")[-1].lower(),
        }
        if key in candidates:
            return entry
    return None
