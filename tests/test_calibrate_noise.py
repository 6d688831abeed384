"""A calibration too noisy to trust is refused unless --force, on injected timings.

The noise criterion (:func:`simulator.calibrate.timing.noise_problem`) is checked on
hand-made :class:`Timing` values; the command's refusal runs the real quick CPU calibration
pipeline with the kernel timer replaced by one that returns injected timings without timing
anything (no assertion here depends on how fast or busy this machine is).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from simulator.calibrate import runner as calibrate_runner
from simulator.calibrate.timing import NOISY_BLOCK_SPREAD, NOISY_SPREAD, Timing, noise_problem
from simulator.cli import app

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def _timing(spread: float, median_s: float = 1e-3) -> Timing:
    """A timing whose interquartile range is ``spread`` x its median, centred on it."""
    return Timing(median_s, median_s * (1 - spread / 2), median_s * (1 + spread / 2), 20)


def test_spread_is_the_interquartile_range_over_the_median():
    # p25 = 0.9 ms, p75 = 1.1 ms around a 1 ms median: (1.1 - 0.9) / 1.0 = 0.2
    assert Timing(1e-3, 0.9e-3, 1.1e-3, 10).spread == pytest.approx(0.2)
    assert _timing(0.3).spread == pytest.approx(0.3)


def test_the_median_kernel_spread_decides():
    """Spreads 0.02, 0.30, 0.25: median 0.25 > 0.10, too noisy; 0.02, 0.30, 0.05: median 0.05,
    kept (one disturbed kernel does not condemn the run); 0.0999 is kept and 0.1001 is not
    (the bound is 0.10)."""
    noisy = noise_problem([_timing(0.02), _timing(0.30), _timing(0.25)])
    assert noisy is not None and "25%" in noisy and "3 GEMM and attention timings" in noisy
    assert noise_problem([_timing(0.02), _timing(0.30), _timing(0.05)]) is None
    assert noise_problem([_timing(0.0999)] * 3) is None
    assert noise_problem([_timing(0.1001)] * 3) is not None
    assert NOISY_SPREAD == 0.10 and NOISY_BLOCK_SPREAD == 0.20


def test_the_block_spread_has_its_own_bound():
    quiet = [_timing(0.01)] * 4
    assert noise_problem(quiet, _timing(0.15)) is None  # 15% <= 20%
    verdict = noise_problem(quiet, _timing(0.35))
    assert verdict is not None and "closed-loop block" in verdict and "35%" in verdict
    both = noise_problem([_timing(0.5)] * 2, _timing(0.5))
    assert both is not None and "kernel" in both and "block" in both
    assert noise_problem([], None) is None


class _InjectedTimer:
    """Stands in for KernelTimer: returns a timing of the given spread for every kernel without
    calling it. Medians grow with each call (1 ms, 1.1 ms, ...) so that a forward + backward is
    longer than its forward, as the fit expects."""

    def __init__(self, spread: float) -> None:
        self.spread, self.calls = spread, 0

    def __call__(self, fn: Callable[[], Any]) -> Timing:
        self.calls += 1
        return _timing(self.spread, 1e-3 * (1 + 0.1 * self.calls))


def _calibrate(monkeypatch: pytest.MonkeyPatch, spread: float, out: Path, *extra: str) -> Any:
    monkeypatch.setattr(calibrate_runner, "KernelTimer", lambda *a, **k: _InjectedTimer(spread))
    return CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--quick", "--dtype", "fp32", "--threads", "1",
                                    "--out", str(out), *extra])


@needs_torch
@pytest.mark.torch
def test_noisy_calibration_writes_nothing_without_force(monkeypatch, tmp_path):
    out = tmp_path / "noisy.yaml"
    result = _calibrate(monkeypatch, 0.4, out)
    assert result.exit_code == 2, result.output
    assert not out.exists()
    text = " ".join(result.output.split())
    assert "not writing" in text and "too noisy" in text and "40%" in text and "--force" in text
    assert "Traceback" not in result.output

    forced = _calibrate(monkeypatch, 0.4, out, "--force")
    assert forced.exit_code == 0, forced.output
    noise = yaml.safe_load(out.read_text())["metadata"]["noise"]
    # every injected timing spreads by 0.4: the median over kernels and the block are 0.4
    assert noise["too_noisy"] is True and noise["forced"] is True
    assert noise["kernel_spread_median"] == pytest.approx(0.4) and noise["block_spread"] == pytest.approx(0.4)


@needs_torch
@pytest.mark.torch
def test_steady_calibration_is_written(monkeypatch, tmp_path):
    out = tmp_path / "steady.yaml"
    result = _calibrate(monkeypatch, 0.02, out)
    assert result.exit_code == 0, result.output
    noise = yaml.safe_load(out.read_text())["metadata"]["noise"]
    assert noise["too_noisy"] is False and "forced" not in noise
    assert noise["kernel_spread_median"] == pytest.approx(0.02)
