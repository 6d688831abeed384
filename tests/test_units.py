"""The unit parser: case carries meaning (b = bit, B = byte), SI and IEC prefixes."""

import math

import pytest

from simulator import units
from simulator.units import UnitError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 2**30),
        ("80GB", 80e9),
        ("1.5TB", 1.5e12),
        ("512MiB", 512 * 2**20),
        ("8Gb", 1e9),  # 8 gigabits = 1 gigabyte
        ("64 KiB", 65536),
        ("100", 100.0),
        (4096, 4096.0),
    ],
)
def test_bytes(text, expected):
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400Gbps", 50e9),  # 400e9 bit/s / 8
        ("400Gb/s", 50e9),
        ("25GB/s", 25e9),
        ("25GBps", 25e9),
        ("100 Mbps", 12.5e6),
        ("1.6Tbps", 200e9),
    ],
)
def test_rates(text, expected):
    assert units.parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2us", 2e-6), ("2µs", 2e-6), ("1.5ms", 1.5e-3), ("30s", 30.0), ("100ns", 1e-7), ("2min", 120.0), ("1h", 3600.0)],
)
def test_times(text, expected):
    assert units.parse_time(text) == pytest.approx(expected)


def test_flop_rates_and_counts():
    assert units.parse_flop_rate("312TFLOPS") == pytest.approx(312e12)
    assert units.parse_flop_rate("989.4 TFLOP/s") == pytest.approx(989.4e12)
    assert units.parse_flops("6e18FLOP") == pytest.approx(6e18)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (units.parse_bytes, "80KB"),  # 'K' is not an SI prefix: case matters
        (units.parse_bytes, "lots"),
        (units.parse_rate, "400Gbs"),
        (units.parse_rate, "25GB"),  # a size is not a rate
        (units.parse_time, "5 parsecs"),
        (units.parse_bytes, True),
        (units.parse_bytes, "nanGB"),
    ],
)
def test_rejects_with_a_hint(parser, text):
    with pytest.raises(UnitError):
        parser(text)


def test_error_message_names_the_input_and_an_example():
    with pytest.raises(UnitError, match=r"'400Gbs'.*400Gbps"):
        units.parse_rate("400Gbs")


def test_infinite_is_rejected():
    with pytest.raises(UnitError):
        units.parse_time(math.inf)


def test_format_round_trip():
    assert units.format_bytes(80 * 2**30) == "80 GiB"
    assert units.format_rate(50e9) == "50 GB/s"
    assert units.format_time(2.5e-6) == "2.5 us"
    assert units.format_flop_rate(312e12) == "312 TFLOP/s"
