"""The flow network: hand-derivable transfer times, max-min sharing, byte conservation."""

import numpy as np
import pytest
import simpy

from simulator.engine.network import PhaseLoad, network_model

GiB = 2**30


def _run(capacities, transfers, mode="flow"):
    """transfers: list of (start_s, classes, flows, bytes_per_flow, latency_s, cap); returns end times."""
    env = simpy.Environment()
    net = network_model(mode)(env, np.array(capacities, dtype=float))
    ends = [None] * len(transfers)

    def start(i, load):
        net.transfer_phases([load], lambda: ends.__setitem__(i, env.now))

    for i, (t0, classes, flows, nbytes, latency, *cap) in enumerate(transfers):
        load = PhaseLoad(np.array(classes), np.array(flows, dtype=float), nbytes, latency,
                         cap[0] if cap else float("inf"))
        ev = env.timeout(t0)
        ev.callbacks.append(lambda _e, i=i, load=load: start(i, load))
    env.run()
    return ends, net


def test_one_transfer_is_latency_plus_size_over_bandwidth():
    """1 GiB over one 25 GB/s link with 5 us latency: 5e-6 + 2**30 / 25e9 = 0.04295467 s."""
    ends, _ = _run([25e9], [(0.0, [0], [1.0], GiB, 5e-6)])
    assert ends[0] == pytest.approx(5e-6 + GiB / 25e9, rel=1e-12)


def test_two_flows_on_one_link_get_half_each():
    """Two 1 GiB flows share a 10 GB/s link: 5 GB/s each, both end at 2 * 2**30 / 10e9 s."""
    ends, _ = _run([10e9], [(0.0, [0], [1.0], GiB, 0.0), (0.0, [0], [1.0], GiB, 0.0)])
    assert ends == pytest.approx([2 * GiB / 10e9] * 2, rel=1e-12)


def test_rates_are_recomputed_when_a_flow_ends():
    """B = 1 GiB and 2 GiB on a 10 GB/s link: both at 5 GB/s until the first ends at 2B/C,
    then the second has B left at full rate: it ends at 2B/C + B/C = 3B/C."""
    ends, _ = _run([10e9], [(0.0, [0], [1.0], GiB, 0.0), (0.0, [0], [1.0], 2 * GiB, 0.0)])
    assert ends == pytest.approx([2 * GiB / 10e9, 3 * GiB / 10e9], rel=1e-12)


def test_late_arrival_slows_the_first():
    """Flow A (1 GiB, 10 GB/s link) alone for 50 ms moves 0.5 GB; then B arrives and both get
    5 GB/s: A's remaining 2**30 - 5e8 bytes take (2**30 - 5e8)/5e9 s."""
    ends, _ = _run([10e9], [(0.0, [0], [1.0], GiB, 0.0), (0.05, [0], [1.0], GiB, 0.0)])
    a_end = 0.05 + (GiB - 5e8) / 5e9
    assert ends[0] == pytest.approx(a_end, rel=1e-12)
    # B then has 2**30 - 5e9 * (a_end - 0.05) bytes left at 10 GB/s
    assert ends[1] == pytest.approx(a_end + (GiB - 5e9 * (a_end - 0.05)) / 10e9, rel=1e-12)


def test_max_min_fairness_with_two_bottlenecks():
    """Classic: link 0 (1 GB/s) carries A and B, link 1 (10 GB/s) carries B and C. Max-min:
    A = B = 0.5 GB/s (link 0 saturates), C takes the rest of link 1: 9.5 GB/s."""
    size = 1e9
    ends, _ = _run([1e9, 10e9], [(0.0, [0], [1.0], size, 0.0), (0.0, [0, 1], [1.0, 1.0], size, 0.0),
                                 (0.0, [1], [1.0], size, 0.0)])
    assert ends[2] == pytest.approx(size / 9.5e9, rel=1e-9)
    assert ends[0] == pytest.approx(size / 0.5e9, rel=1e-9)


def test_coupled_phase_moves_at_its_busiest_link():
    """A ring phase with 2 of its flows on link 0 (8 GB/s) and 1 on link 1: per-flow rate
    min(8/2, 8/1) = 4 GB/s; 1 GB per flow takes 0.25 s."""
    ends, _ = _run([8e9, 8e9], [(0.0, [0, 1], [2.0, 1.0], 1e9, 0.0)])
    assert ends[0] == pytest.approx(0.25, rel=1e-12)


def test_per_flow_cap():
    """A TCP-like flow capped at 1.25 GB/s on a 12.5 GB/s link: 1 GB takes 0.8 s."""
    ends, _ = _run([12.5e9], [(0.0, [0], [1.0], 1e9, 0.0, 1.25e9)])
    assert ends[0] == pytest.approx(0.8, rel=1e-12)


def test_analytical_mode_ignores_contention():
    ends, _ = _run([10e9], [(0.0, [0], [1.0], GiB, 0.0), (0.0, [0], [1.0], GiB, 0.0)], mode="analytical")
    assert ends == pytest.approx([GiB / 10e9] * 2, rel=1e-12)


def test_bytes_are_conserved():
    """Every byte of every flow is accounted on every link it crosses, across rate changes."""
    transfers = [(0.0, [0, 1], [1.0, 2.0], 3e8, 1e-6), (0.01, [1, 2], [1.0, 1.0], 5e8, 0.0),
                 (0.02, [0], [3.0], 1e8, 0.0)]
    _, net = _run([4e9, 6e9, 5e9], transfers)
    expected = np.zeros(3)
    for _, classes, flows, nbytes, _ in transfers:
        expected[classes] += np.array(flows) * nbytes
    assert net.bytes_carried == pytest.approx(expected, rel=1e-9)
