"""Command (filled in by its issue)."""

import typer


def simulate_command() -> None:
    """Not built yet."""
    raise typer.Exit(2)
