"""Failures a user can cause, turned into one line that says what to do next.

Commands raise what they raise (a missing kubeconfig, a busy port, an
unreachable extender); :class:`TandemGroup` catches it once at the root of the
``tandem`` command, prints :func:`explain`'s line on stderr and exits 1. With
``tandem --debug ...`` the exception propagates with its traceback instead.

Exception types are matched by module and class name, so this module imports
neither kubernetes nor urllib3 and ``tandem --help`` stays fast.
"""

from __future__ import annotations

import errno
from typing import Any

import typer
import typer.core

DEBUG_KEY = "tandem.debug"


def _names(exc: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}


def explain(exc: BaseException) -> str:
    """One line naming the problem and the fix (the last resort names the exception)."""
    names = _names(exc)
    if "kubernetes.config.config_exception.ConfigException" in names:
        return ("no Kubernetes configuration found: set KUBECONFIG (or create ~/.kube/config), "
                "run inside the cluster, or use --cluster sim:FILE for a simulated cluster")
    if "kubernetes.client.exceptions.ApiException" in names:
        status, reason = getattr(exc, "status", "?"), getattr(exc, "reason", "") or ""
        hint = ("check the RBAC rules of the identity in use" if status in (401, 403)
                else "check that the API server is reachable and the object exists")
        return f"the Kubernetes API answered {status} {reason}: {hint}"
    if "urllib3.exceptions.MaxRetryError" in names or "urllib3.exceptions.HTTPError" in names:
        return (f"cannot reach the Kubernetes API server ({_first_line(exc)}): check KUBECONFIG "
                "and its current context")
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return (f"{exc.strerror or _first_line(exc)}: another process holds the port; stop it "
                "or choose another with --port")
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM):
        target = exc.filename or _first_line(exc)
        return f"permission denied: {target}; run as a user that may use it, or pick another"
    if isinstance(exc, FileNotFoundError):
        return f"no such file: {exc.filename or _first_line(exc)}; check the path"
    if isinstance(exc, MemoryError):
        return "out of memory: try a smaller input (fewer jobs, a smaller cluster)"
    return (f"unexpected {type(exc).__name__}: {_first_line(exc)} "
            "(run `tandem --debug ...` for the traceback)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class TandemGroup(typer.core.TyperGroup):
    """The root group: every command runs inside one error-to-message layer."""

    def invoke(self, ctx: Any) -> Any:
        """Run the command; a failure becomes one line on stderr and exit 1 (unless --debug)."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # Usage errors, typer.Exit and Ctrl-C already speak for themselves.
            passes = isinstance(exc, (typer.Exit, typer.Abort)) or any(
                n.endswith(".ClickException") for n in _names(exc))
            if passes or ctx.meta.get(DEBUG_KEY):
                raise
            typer.echo(f"error: {explain(exc)}", err=True)
            raise typer.Exit(1) from None
