"""The `autotm` command line (app), its bench and plot sub-commands (bench)."""

from .app import app, main

__all__ = ["app", "main"]
