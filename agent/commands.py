"""Command-line commands of this package (filled in by its issue)."""

import typer

app = typer.Typer(no_args_is_help=True)
