"""The docs' pictures are drawn by docs/figures/make_figures.py from code (the
placement from a real ``tandem demo`` run) and committed as the script draws them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures"


def _script():
    spec = importlib.util.spec_from_file_location("make_figures", FIGURES / "make_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_picture_is_what_the_script_draws(tmp_path: Path) -> None:
    _script().architecture(tmp_path / "a.svg")
    assert (tmp_path / "a.svg").read_bytes() == (FIGURES / "architecture.svg").read_bytes(), \
        "run: python docs/figures/make_figures.py"


def test_the_placement_picture_shows_the_demos_placements() -> None:
    from tandem.demo import run_demo

    placed = [p["pod"] for p in run_demo(seed=7)["placements"] if p["outcome"] == "placed"]
    text = (FIGURES / "placement.svg").read_text()
    assert all(pod in text for pod in placed)
    assert "train-no-gain" not in text  # refused pods take no GPU


@pytest.mark.parametrize(("doc", "figure"), [("docs/architecture.md", "architecture.svg"),
                                             ("README.md", "placement.svg")])
def test_the_docs_show_the_pictures(doc: str, figure: str) -> None:
    assert f"figures/{figure}" in (REPO / doc).read_text()
