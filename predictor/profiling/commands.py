"""Command (filled in by its issue)."""

import typer


def profile_command() -> None:
    """Not built yet."""
    raise typer.Exit(2)
