"""Notebooks are committed without outputs and in step with their jupytext .py pairs.

(``make notebooks`` executes them; this only checks what is committed.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 5, [n.name for n in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_matches_its_jupytext_pair(path):
    jupytext = pytest.importorskip("jupytext")
    pair = path.with_suffix(".py")
    assert pair.is_file(), f"{pair.name} missing (jupytext --set-formats ipynb,py:percent)"
    from_py = [(c.cell_type, c.source.strip()) for c in jupytext.read(pair).cells]
    from_nb = [(c["cell_type"], "".join(c["source"]).strip()) for c in json.loads(path.read_text())["cells"]]
    assert from_py == from_nb, f"{path.name} and {pair.name} differ: run jupytext --sync {pair}"
