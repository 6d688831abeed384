"""The worked examples of docs/architecture.md run as written (``python -c``, from the
repository root, in a fresh interpreter): a toy strategy, mesh axis, fabric and network model
registered from outside the package."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
EXAMPLES = re.findall(r"```python example\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_its_examples():
    assert len(EXAMPLES) == 4  # strategy, mesh axis, fabric, network model


@pytest.mark.parametrize("code", EXAMPLES, ids=["strategy", "axis", "fabric", "network"])
def test_example_runs(code):
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip(), "an example prints what it shows"
    assert "Warning" not in out.stderr, out.stderr
