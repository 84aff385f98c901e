"""``python -m predictor.profiling run|plan ...``: the profiler without the root CLI.

On a GPU machine where tandem is not installed (only the source tree and its
dependencies), ``PYTHONPATH=. python3 -m predictor.profiling run --backend cuda``
is the same command as ``tandem profile run --backend cuda``.
"""

from predictor.profiling.commands import profile_app


def main() -> None:
    """Run ``tandem profile``'s subcommands without the root CLI."""
    profile_app(prog_name="python -m predictor.profiling")


if __name__ == "__main__":
    main()
