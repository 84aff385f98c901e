"""The one answer to "which namespace does tandem keep its objects in?".

Everything the extender stores in the API server (the learning ConfigMap, the
Leases it elects on or follows, its leader label) lives in the install's
namespace, resolved in this order:

1. a namespace the configuration names (``learning.namespace``), when it names one;
2. ``POD_NAMESPACE`` (the downward API: every shipped install sets it);
3. the service account's namespace file (in a pod without ``POD_NAMESPACE``);
4. ``tandem-system``, the namespace the installs create (outside a pod: a
   developer's ``tandem extender serve --cluster kube`` reaches the install's
   objects, which its RBAC grants, never ``default``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

INSTALL_NAMESPACE = "tandem-system"
"""The namespace ``manifests/base/namespace.yaml`` and the chart's default install create."""
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace(configured: str | None = None, environ: Mapping[str, str] | None = None,
                  service_account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace for tandem's own objects (module doc for the order)."""
    if configured:
        return configured
    env = os.environ if environ is None else environ
    if env.get("POD_NAMESPACE", "").strip():
        return env["POD_NAMESPACE"].strip()
    try:
        found = service_account_file.read_text(encoding="utf-8").strip()
    except OSError:
        found = ""
    return found or INSTALL_NAMESPACE
