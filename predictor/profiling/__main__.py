"""``python -m predictor.profiling run|plan ...``: the profiler without the root CLI.

On a GPU machine where tandem is not installed (only the source tree and its
dependencies), ``PYTHONPATH=. python3 -m predictor.profiling run --backend cuda``
is the same command as ``tandem profile run --backend cuda``.
"""

import typer

from predictor.profiling.commands import profile_command


def main() -> None:
    """Run ``profile_command`` as a one-command Typer app."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(profile_command)
    app()


if __name__ == "__main__":
    main()
