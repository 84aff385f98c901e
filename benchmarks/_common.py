"""What every benchmark shares: the import-path guard, the run's context, the result file.

A benchmark run as a script (``.venv/bin/python benchmarks/NAME.py``) has
``benchmarks/`` as ``sys.path[0]``, where this folder's ``predictor.py`` would
shadow the ``predictor`` package. So each benchmark's first import is
``import _common`` (found in ``benchmarks/`` itself, and sorted by ruff before the
project's packages): importing it puts the repository root in that slot, and every
later import comes from the checkout.

``context(packages)`` is the run's context for the result: CPU model (from
``/proc/cpuinfo``), core count, Python and package versions, load average and
whether the machine was busy, the date and the command. ``write_result`` prints
the result as one JSON object and writes the same text to ``--out`` (by default
``benchmarks/results/<name>.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
BUSY_LOAD_PER_CORE = 0.5
"""1-minute load per core above which the numbers were taken beside other work."""


def _guard_import_path() -> None:
    # Only the script's own folder is replaced: under pytest or -m the path is left alone.
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
        sys.path[0] = str(ROOT)


_guard_import_path()


def map_tasks(run: Callable[[T], R], tasks: Sequence[T], processes: int) -> list[R]:
    """``run`` over ``tasks`` in order, in ``processes`` processes when more than one
    (each task's result is the same however many)."""
    if processes > 1:
        with ProcessPoolExecutor(processes) as pool:
            return list(pool.map(run, tasks))
    return [run(task) for task in tasks]


def sibling(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as module ``name``, loaded by file path: ``benchmarks/``
    is not on the path of a running benchmark (above) and is not a package. The tests
    load benchmarks through it too (``tests/bench_modules.py``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    spec.loader.exec_module(module)
    return module


def run_child(script: str, tree: Path, args: Sequence[str]) -> dict[str, Any]:
    """Run ``script --child TREE ARGS`` with ``tree`` first on the path (another checkout
    measured in the same run) and return the JSON its last line prints."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, script, "--child", str(tree), *args], env=env,
                          capture_output=True, text=True, check=True, cwd=str(tree))
    return json.loads(done.stdout.strip().splitlines()[-1])


def interleaved(against: Path | None, repeats: int,
                run: Callable[[Path], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``run`` over this checkout (``branch``) and ``against`` (when given), one after the
    other ``repeats`` times, so load from elsewhere hits both alike: each label's runs."""
    trees = {"branch": ROOT, **({"against": against} if against else {})}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for _ in range(repeats):
        for label, tree in trees.items():
            runs[label].append(run(tree))
    return runs


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages, rounded; empty where the OS has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return []


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _relative(path: str) -> str:
    """``path`` relative to the repository; an absolute path elsewhere keeps only what
    does not name the machine (``.venv/bin/python`` of another checkout's venv, else
    ``.../<name>``): committed results carry no machine's directories."""
    # Absolute, not resolved: the venv's python is a symlink whose name is the point.
    absolute = Path(path).absolute()
    if absolute.is_relative_to(ROOT):
        return str(absolute.relative_to(ROOT))
    if not Path(path).is_absolute():
        return path
    parts = absolute.parts
    if ".venv" in parts:
        return str(Path(*parts[parts.index(".venv"):]))
    return f".../{absolute.name}"


def command() -> str:
    """The command line that ran this benchmark, with paths relative to the repository."""
    return " ".join([_relative(sys.executable), _relative(sys.argv[0]),
                     *(_relative(a) if a.startswith("/") else a for a in sys.argv[1:])])


def scrubbed(text: str) -> str:
    """``text`` with the repository's absolute path (and the home directory) taken out."""
    return text.replace(f"{ROOT}/", "").replace(str(ROOT), ".").replace(
        f"{Path.home()}/", "~/")


def context(packages: Sequence[str]) -> dict[str, Any]:
    """``machine`` (CPU, cores, versions, load, busy), ``date`` and ``command`` of this run."""
    cores = os.cpu_count() or 1
    load = load_average()
    busy = bool(load) and load[0] > BUSY_LOAD_PER_CORE * cores
    machine: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": cores,
        "python": platform.python_version(),
        "packages": {name: _package_version(name) for name in packages},
        "load_average_1_5_15": load,
        "busy": busy,
    }
    if busy:
        machine["note"] = ("the 1-minute load average (this run included) was above "
                           f"{BUSY_LOAD_PER_CORE:g} per core: timings may be noisier")
    return {
        "machine": machine,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command(),
    }


def add_out_option(parser: argparse.ArgumentParser, name: str | None) -> None:
    """``--out PATH``: where the result goes (``benchmarks/results/<name>.json`` by default)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None if name is None else RESULTS / f"{name}.json",
        help="where to write the result JSON (default: benchmarks/results/)",
    )


def write_result(result: dict[str, Any], out: Path) -> None:
    """Print the result as one JSON object and write the same text to ``out``."""
    text = scrubbed(json.dumps(result, indent=2))
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n", encoding="utf-8")
