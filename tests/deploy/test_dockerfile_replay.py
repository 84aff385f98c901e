"""The Dockerfile's install steps, replayed without Docker: every COPY source exists and
passes .dockerignore, every package is copied, each uninstall removes something the
install before it put there, and what each image ends up asking pip for resolves for
that image's Python (``uv pip compile`` against the package index). The slow test
runs the CPU image's pip steps for real in a fresh venv."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]["name"]
# The Python each base image runs: a new base must be added here, so its packages are
# resolved for the right interpreter.
BASE_PYTHON = {"python:3.11-slim-bookworm": "3.11",
               "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04": "3.12"}
PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")


@dataclass
class Stage:
    name: str
    base: str
    copies: list[list[str]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(spec: str) -> str:
    return _norm(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0])


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined."""
    text = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "ARG" and "=" in rest and not stages:
            key, _, value = rest.partition("=")
            args[key] = value.strip('"')
        elif word == "FROM":
            base, _, name = rest.partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base.strip())
            stages.append(Stage(name.strip(), base))
        elif word == "COPY" and not rest.startswith("--from"):
            stages[-1].copies.append(shlex.split(rest)[:-1])
        elif word == "RUN":
            stages[-1].runs.append(re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""),
                                          rest))
    return args, stages


ARGS, STAGES = parse(DOCKERFILE.read_text())
BUILDS = {s.name: s for s in STAGES if s.name.startswith("build-")}


def final_requirements(stage: Stage) -> list[str]:
    """What the stage's pip steps leave installed, as requirement specs, replayed in order."""
    installed: dict[str, str] = {}
    for run in stage.runs:
        for step in run.split("&&"):
            words = shlex.split(step)
            if len(words) < 3 or not words[0].endswith("/pip"):
                continue
            verb, rest = words[1], [w for w in words[2:] if not w.startswith("-")]
            if verb == "install":
                for spec in rest:
                    if spec == ".":
                        installed[_norm(PROJECT)] = PROJECT
                        if "--no-deps" not in words:
                            deps = PYPROJECT["project"]["dependencies"]
                            installed |= {_req_name(d): d for d in deps}
                    else:
                        installed[_req_name(spec)] = spec
            elif verb == "uninstall":
                for name in rest:
                    assert _norm(name) in installed, f"{stage.name}: uninstalls {name}, not there"
                    del installed[_norm(name)]
    return [spec for name, spec in installed.items() if name != _norm(PROJECT)]


def test_images_and_their_targets() -> None:
    names = [s.name for s in STAGES]
    assert names[-1] == "cpu", "the default target (last stage) is the CPU image"
    assert {"cpu", "gpu", "build-cpu", "build-gpu"} <= set(names)
    assert all(s.base in BASE_PYTHON or s.base.startswith("build-") or s.name in ("cpu", "gpu")
               for s in STAGES)


# In the distribution, not in the images: the offline tools (docs/architecture.md, Layout).
OFFLINE_PACKAGES = {"lab"}


def test_every_package_is_copied_and_passes_dockerignore() -> None:
    packages = set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    packages = {p.rstrip("*") for p in packages} - OFFLINE_PACKAGES
    rules = [r for r in (REPO / ".dockerignore").read_text().splitlines()
             if r and not r.startswith("#")]
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for stage in BUILDS.values():
        sources = {src for copy in stage.copies for src in copy}
        assert packages <= sources, f"{stage.name} does not copy {packages - sources}"
        for src in sources:
            assert (REPO / src).exists(), src
            assert src in allowed, f"{src} is copied but .dockerignore leaves it out"
        stubs = re.search(r"for p in ([\w ]+); do", " ".join(stage.runs))
        assert stubs and set(stubs.group(1).split()) == packages, stage.name


def _uv() -> str | None:
    sibling = Path(sys.executable).with_name("uv")
    return str(sibling) if sibling.is_file() else shutil.which("uv")


def _resolve(requirements: list[str], python: str, tmp: Path) -> dict[str, str]:
    """{package: version} a fresh resolve for that Python on Linux x86_64 picks (wheels only).

    uv reads only the packages' metadata, so this takes seconds where ``pip install
    --dry-run`` downloads every candidate wheel (onnxruntime-gpu alone is 300 MB).
    """
    uv = _uv()
    if uv is None:
        pytest.skip("uv not installed (the dev extra has it)")
    (tmp / "requirements.in").write_text("\n".join(requirements) + "\n")
    result = subprocess.run(
        [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--only-binary",
         ":all:", "--python-version", python, "--python-platform", "x86_64-manylinux_2_28",
         str(tmp / "requirements.in")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "UV_NO_PROGRESS": "1"})
    if result.returncode and re.search(r"(?i)failed to fetch|error sending request|dns error",
                                       result.stderr):
        pytest.skip(f"package index not reachable: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr[-2000:]
    pins = [line.split("==") for line in result.stdout.splitlines() if "==" in line]
    return {_norm(name): version.strip() for name, version in pins}


def test_cpu_image_packages_resolve(tmp_path: Path) -> None:
    stage = BUILDS["build-cpu"]
    resolved = _resolve(final_requirements(stage), BASE_PYTHON[stage.base], tmp_path)
    assert "onnxruntime" in resolved and "onnxruntime-gpu" not in resolved
    assert "torch" not in resolved


def test_gpu_image_packages_resolve_for_the_base_image_cuda(tmp_path: Path) -> None:
    stage = BUILDS["build-gpu"]
    requirements = final_requirements(stage)
    assert "onnxruntime" not in {_req_name(r) for r in requirements}
    assert "onnxruntime-gpu" in {_req_name(r) for r in requirements}
    # onnxruntime-gpu's "cuda" extra names the CUDA libraries its build links against:
    # they must be of the base image's CUDA major version.
    with_cuda = [r.replace("onnxruntime-gpu", "onnxruntime-gpu[cuda]", 1)
                 if _req_name(r) == "onnxruntime-gpu" else r for r in requirements]
    resolved = _resolve(with_cuda, BASE_PYTHON[stage.base], tmp_path)
    assert "onnxruntime" not in resolved, "both wheels would write the onnxruntime module"
    cuda_major = re.search(r"nvidia/cuda:(\d+)\.", stage.base).group(1)
    runtime = [n for n in resolved if n.startswith("nvidia-cuda-runtime")]
    assert runtime, sorted(resolved)
    assert all(n.endswith(f"-cu{cuda_major}") or
               (n == "nvidia-cuda-runtime" and resolved[n].startswith(f"{cuda_major}."))
               for n in runtime), (resolved["onnxruntime-gpu"], runtime)


def test_gpu_torch_image_has_cpu_onnxruntime_and_a_cuda_build_of_torch(tmp_path: Path) -> None:
    stage = BUILDS["build-gpu-torch"]
    requirements = final_requirements(stage)
    names = {_req_name(r) for r in requirements}
    assert {"onnxruntime", "torch"} <= names and "onnxruntime-gpu" not in names
    resolved = _resolve(requirements, BASE_PYTHON[stage.base], tmp_path)
    # PyPI's Linux torch wheels are CUDA builds: they pull NVIDIA's CUDA runtime wheels.
    assert any(n.startswith("nvidia-cuda-runtime") for n in resolved), sorted(resolved)


@pytest.mark.slow
def test_cpu_build_steps_install_and_run_in_a_fresh_venv(tmp_path: Path) -> None:
    stage = BUILDS["build-cpu"]
    src, venv = tmp_path / "src", tmp_path / "venv"
    src.mkdir()
    steps = list(stage.runs)
    # Replay in Dockerfile order: each COPY before the RUN lines that follow it.
    for copy in stage.copies:
        for item in copy:
            path = REPO / item
            if path.is_dir():
                shutil.copytree(path, src / item, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(path, src / item)
    for run in steps:
        command = run.replace("/opt/tandem", str(venv))
        command = command.replace("python3 -m venv", f"{sys.executable} -m venv")
        subprocess.run(["bash", "-ec", command], cwd=src, check=True, timeout=1200)
    out = subprocess.run([venv / "bin" / "tandem", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and PYPROJECT["project"]["version"] in out.stdout
