"""Placeholder: this command family is being built."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
