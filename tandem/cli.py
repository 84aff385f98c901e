"""The ``tandem`` command: one Typer app composed from each package's commands.

Every command module imports only Typer at import time and loads its heavy
dependencies inside the command, so ``tandem --help`` stays fast and the agent
image does not need the extender's libraries to start. Failures a user can
cause are turned into one line by :class:`tandem.errors.TandemGroup`.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

from agent.commands import app as agent_app
from contracts.version import DISTRIBUTION, version
from extender.commands import app as extender_app
from extender.ops.status import status_command
from predictor.commands import app as predictor_app
from predictor.profiling.commands import profile_app
from tandem.demo import demo_command
from tandem.errors import DEBUG_KEY, TandemGroup

app = typer.Typer(
    name="tandem",
    cls=TandemGroup,
    help="GPU co-location for Kubernetes: predict, place, and share GPUs under SLOs.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # every subcommand too
    pretty_exceptions_enable=False,
    # click's plain help: flags without a value hint (no "--json <bool>"), text
    # wrapped at the terminal's width instead of option names and help cut short.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"tandem {version()} ({DISTRIBUTION})")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback when a command fails."),
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the version (the images and the Helm chart carry the same) and exit.",
    ),
) -> None:
    """GPU co-location for Kubernetes: predict, place, and share GPUs under SLOs."""
    ctx.meta[DEBUG_KEY] = debug


app.command("demo")(demo_command)
app.command("status")(status_command)
app.add_typer(extender_app, name="extender", help="The kube-scheduler extender service.")
app.add_typer(agent_app, name="agent", help="Node agent and per-GPU inference server.")
app.add_typer(predictor_app, name="predictor", help="Graph features, prediction, training.")
app.add_typer(profile_app, name="profile", help="Profiling campaigns on a GPU (or a sim: backend).")

# The offline tools' commands, by module: the images carry only the deployables, and
# there (where the tools' package is not installed) these commands are absent.
OFFLINE_COMMANDS = (
    ("plan", "lab.planning.commands", "plan_command"),
    ("simulate", "lab.simulator.commands", "simulate_command"),
    ("import-interference", "lab.simulator.commands", "import_interference_command"),
)
for _name, _module, _command in OFFLINE_COMMANDS:
    if importlib.util.find_spec(_module.split(".")[0]) is not None:
        app.command(_name)(getattr(importlib.import_module(_module), _command))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
