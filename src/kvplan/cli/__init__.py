"""The ``kvplan`` command line (typer). ``main`` is the console-script entry point."""

from kvplan.cli.app import app, main

__all__ = ["app", "main"]
