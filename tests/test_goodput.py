"""Goodput of a whole run (issue 16 item 3): checkpoint intervals, the expected run, the replay of a
failure schedule, checkpoint sizes and ``dtsim goodput``, pinned to hand-derived numbers."""

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import simulator
from simulator.costs.goodput import (
    Failure,
    daly_interval_s,
    expected_run,
    poisson_at_least,
    poisson_excess,
    replay,
    young_interval_s,
)
from simulator.goodput import checkpoint_bytes, estimate, inputs_for
from simulator.scenario.reliability import ReliabilitySpec
from simulator.units import UnitError, parse_count

ROOT = Path(__file__).resolve().parents[1]
MIN, HOUR = 60.0, 3600.0


def test_young_interval_is_sqrt_2cm():
    """C = 5 min, M = 24 h: sqrt(2 x 300 s x 86,400 s) = sqrt(51,840,000) = 7,200 s = 2 h."""
    assert young_interval_s(5 * MIN, 24 * HOUR) == pytest.approx(7200.0)
    # C = 2 s, M = 1 h: sqrt(2 x 2 x 3600) = sqrt(14,400) = 120 s
    assert young_interval_s(2.0, HOUR) == pytest.approx(120.0)


@pytest.mark.parametrize("mtbf_min, expected_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_interval_matches_the_papers_worked_examples(mtbf_min, expected_min):
    """Daly 2006 Figs. 3-5 (δ = 5 min) predict τopt = 117, 57 and 9.1 min for M = 24 h, 6 h, 15 min.
    M = 24 h by hand: sqrt(2*5*1440) = 120; x = 5/2880; 120 (1 + sqrt(x)/3 + x/9) - 5 = 116.69 min."""
    tau = daly_interval_s(5 * MIN, mtbf_min * MIN) / MIN
    assert round(tau, 1 if expected_min < 10 else 0) == expected_min
    if mtbf_min == 24 * 60:
        assert tau == pytest.approx(116.69, abs=0.01)


def test_daly_interval_is_m_when_the_checkpoint_takes_2m_or_more():
    assert daly_interval_s(2 * HOUR, HOUR) == HOUR


def test_expected_run_is_dalys_complete_model():
    """M = 24 h, R = 10 min, δ = 5 min, τ = 117 min, T_s = 500 h (Daly's Fig. 3):
    T_w = M e^{R/M} (e^{(τ+δ)/M} - 1) T_s / τ = 547.88 h; its parts add up to it."""
    m, r, d, tau, ts = 24 * HOUR, 10 * MIN, 5 * MIN, 117 * MIN, 500 * HOUR
    run = expected_run(ts, tau, d, m, [(1.0, r)])
    closed = m * math.exp(r / m) * math.expm1((tau + d) / m) * ts / tau
    assert run.wall_s == pytest.approx(closed, rel=1e-12)
    assert run.wall_s / HOUR == pytest.approx(547.88, abs=0.01)
    assert run.checkpoint_s == pytest.approx(ts / tau * d)  # 256.4 checkpoints of 5 min


def test_expected_run_without_failures_is_work_plus_checkpoints():
    """10 h of work, a 6-min checkpoint every hour, no failures: 10 h + 10 x 6 min = 11 h."""
    run = expected_run(10 * HOUR, HOUR, 6 * MIN, math.inf, [])
    assert run.wall_s == pytest.approx(11 * HOUR)
    assert run.failures == 0 and run.ettr == pytest.approx(10 / 11)


def test_replay_of_one_failure_by_hand():
    """10 h of work in 1-h pieces, 0.1-h checkpoints, one failure at 2.5 h, 0.5-h restart:
    two pieces and checkpoints end at 2.2 h; 0.3 h lost; restart to 3.0 h; 8 pieces and 7
    checkpoints more: wall = 10 + 9 x 0.1 + 0.3 + 0.5 = 11.7 h, ETTR = 10 / 11.7 = 85.47%."""
    run = replay(10.0, 1.0, 0.1, [Failure(2.5, 0.5)])
    assert (run.checkpoint_s, run.lost_s, run.restart_s) == pytest.approx((0.9, 0.3, 0.5))
    assert run.wall_s == pytest.approx(11.7)
    assert run.ettr == pytest.approx(0.854700854)
    assert run.failures == 1


def test_replay_failure_during_restart_and_after_the_end():
    """A second failure at 2.8 h strikes 0.3 h into the restart: the restart starts again,
    0.3 + 0.5 = 0.8 h of restarts; wall 12.0 h. A failure at 50 h is past the end and ignored."""
    run = replay(10.0, 1.0, 0.1, [Failure(2.5, 0.5), Failure(2.8, 0.5), Failure(50.0, 0.5)])
    assert run.restart_s == pytest.approx(0.8)
    assert run.wall_s == pytest.approx(12.0)
    assert run.failures == 2


def test_replay_planned_interruption_loses_no_work():
    """A planned stop at 2.5 h: the 0.3 h done is saved by a 0.1-h checkpoint, restart 0.5 h;
    7.7 h of work left in 8 pieces (7 checkpoints): wall = 10 + (2 + 1 + 7) x 0.1 + 0.5 = 11.5 h."""
    run = replay(10.0, 1.0, 0.1, [Failure(2.5, 0.5, planned=True)])
    assert run.lost_s == 0.0
    assert run.wall_s == pytest.approx(11.5)
    assert run.planned == 1 and run.failures == 0


def test_replay_asynchronous_checkpoint_not_yet_written_loses_one_piece_more():
    """Write 0.2 h behind each checkpoint; a failure at 2.25 h, 0.05 h after the second
    checkpoint, which is not written yet: lost 0.05 + 1 h, 9 pieces left; wall =
    10 + (2 + 8) x 0.1 + 1.05 + 0.5 = 12.55 h."""
    run = replay(10.0, 1.0, 0.1, [Failure(2.25, 0.5)], write_s=0.2)
    assert run.lost_s == pytest.approx(1.05)
    assert run.wall_s == pytest.approx(12.55)


def test_poisson_helpers():
    """Mean 2: P(N >= 1) = 1 - e^-2 = 0.8647; E[max(0, N - 1)] = 2 - 1 + e^-2 = 1.1353."""
    assert poisson_at_least(2.0, 1) == pytest.approx(1 - math.exp(-2))
    assert poisson_at_least(2.0, 0) == 1.0
    assert poisson_excess(2.0, 1) == pytest.approx(1 + math.exp(-2))
    assert poisson_excess(2.0, 0) == pytest.approx(2.0)


def test_checkpoint_bytes_of_a_small_model():
    """1e9 parameters: bf16 + Adam keeps 2 (weights) + 12 (fp32 master, momentum, variance) = 14 GB;
    fp32 + Adam 4 + 8 = 12 GB; bf16 + SGD 2 + 8 = 10 GB (gradients are not saved)."""
    assert checkpoint_bytes(1e9, "bf16", "adam") == 14e9
    assert checkpoint_bytes(1e9, "fp32", "adam") == 12e9
    assert checkpoint_bytes(1e9, "bf16", "sgd") == 10e9


def test_llama3_default_rates():
    """Table 5 over 54 days = 1,296 h: 268 GPU failures on 16,384 GPUs -> 79,230 h per GPU;
    47 planned -> 27.57 h per job."""
    spec = ReliabilitySpec()
    assert spec.gpu_mtbf / HOUR == pytest.approx(1296 * 16384 / 268)
    assert spec.planned_mtbf / HOUR == pytest.approx(27.574, abs=1e-3)


def test_quickstart_estimate_by_hand():
    """The quick-start scenario (4 p4d nodes, 32 GPUs) with the default rates: checkpoint =
    params x 14 bytes, written at 2 TB/s; hardware rate = 32/gpu_mtbf + 4/node_mtbf + 4 x NICs/link_mtbf."""
    scenario = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                       overrides=["reliability.restart_time=10min"])
    result = simulator.simulate(scenario)
    inputs = inputs_for(scenario, result)
    est = estimate(inputs, 1e9)
    spec = scenario.reliability
    assert est.checkpoint_bytes == result.params * 14
    assert est.write_s == pytest.approx(result.params * 14 / 2e12)
    nics = scenario.cluster.node_type.nics.count
    hw = 32 / spec.gpu_mtbf + 4 / spec.node_mtbf + 4 * nics / spec.link_mtbf
    assert est.hardware_mtbf_s == pytest.approx(1 / hw)
    assert est.steps == math.ceil(1e9 / scenario.tokens_per_step)
    assert est.interval_steps * est.step_time_s == pytest.approx(est.interval_s)
    assert est.ettr < 1.0


def test_parse_count():
    assert parse_count("15T") == 15e12
    assert parse_count("405B") == 405e9
    assert parse_count("2e12") == 2e12
    with pytest.raises(UnitError):
        parse_count("lots")
    with pytest.raises(UnitError):
        parse_count("-3T")


def _dtsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_cli_goodput_json_and_bad_tokens(tmp_path):
    out = tmp_path / "g.json"
    report = tmp_path / "g.html"
    done = _dtsim("goodput", "scenarios/quickstart.yaml", "--tokens", "2B", "--trials", "20", "--json", str(out),
                  "--report", str(report))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    parts = data["breakdown"]
    assert sum(parts.values()) == pytest.approx(data["wall_s"])
    assert data["tokens"] == 2e9 and data["spread"]["wall_s"]["p5"] <= data["spread"]["wall_s"]["p95"]
    page = report.read_text()
    assert page.count("class=\"plotly-graph-div\"") == 3 and "ETTR against checkpoint interval" in page
    bad = _dtsim("goodput", "scenarios/quickstart.yaml", "--tokens", "lots")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "lots" in bad.stderr
    bad = _dtsim("goodput", "scenarios/quickstart.yaml", "--tokens", "1T", "--set", "reliability.gpu_mtbf=-1h")
    assert bad.returncode == 2 and "reliability.gpu_mtbf" in bad.stderr


def test_sweep_metrics_carry_goodput_only_with_a_reliability_section():
    """A sweep point's metrics gain goodput_* columns when the scenario has reliability: {} (the
    Llama 3 defaults); goodput_wall_s >= goodput_ideal_s = steps x step time."""
    from simulator.sweep.worker import result_metrics

    plain = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    result = simulator.simulate(plain)
    assert not any(k.startswith("goodput_") for k in result_metrics(result, plain))
    with_rel = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml", overrides=["reliability.tokens=2B"])
    metrics = result_metrics(result, with_rel)
    steps = math.ceil(2e9 / plain.tokens_per_step)
    assert metrics["goodput_tokens"] == 2e9
    assert metrics["goodput_ideal_s"] == pytest.approx(steps * result.step_time_s)
    assert metrics["goodput_wall_s"] > metrics["goodput_ideal_s"]
    assert metrics["goodput_ettr"] == pytest.approx(metrics["goodput_ideal_s"] / metrics["goodput_wall_s"])


def test_monte_carlo_mean_agrees_with_the_expectation_and_is_seeded():
    """The quick-start job scaled to 2,048 nodes (about 100 failures in 5e14 tokens): the mean
    wall-clock of 100 seeded trials lies within 1% of Daly's expectation; the same seed gives the
    same spread, another seed another."""
    from simulator.goodput.montecarlo import monte_carlo

    scenario = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    inputs = inputs_for(scenario, simulator.simulate(scenario)).scaled(2048)
    est = estimate(inputs, 5e14)
    assert est.run.failures > 80
    a, b, c = (monte_carlo(inputs, est, 100, seed) for seed in (0, 0, 1))
    assert a.spread["wall_s"]["mean"] == pytest.approx(est.wall_s, rel=0.01)
    assert a.spread == b.spread and a.spread != c.spread


def test_free_checkpoints_are_taken_every_step_and_no_failures_need_none():
    """A store without bandwidth caps writes in 0 s: Young's sqrt(2 x 0 x M) = 0 rounds up to one
    step; with every mean time between failures 'infinite' (1e12 s) and no planned stops there is
    nothing to lose: ETTR = 1 up to 1e-6."""
    scenario = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml", overrides=[
        "reliability.checkpoint.storage_write_bandwidth=null", "reliability.checkpoint.storage_read_bandwidth=null"])
    inputs = inputs_for(scenario, simulator.simulate(scenario))
    est = estimate(inputs, 1e9)
    assert est.write_s == 0.0 and est.interval_steps == 1
    calm = {k: 1e12 for k in ("gpu_mtbf", "node_mtbf", "link_mtbf", "software_mtbf")}
    quiet = replace(inputs, spec=inputs.spec.model_copy(update={**calm, "planned_mtbf": None}))
    assert estimate(quiet, 1e9).ettr == pytest.approx(1.0, abs=1e-6)
