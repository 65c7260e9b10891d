"""jaxlm.core.units: the one way numbers are written, checked against hand-worked figures."""

from jaxlm.core.units import binary, count, si


def test_si_prefixes_and_units():
    assert si(1.5e15, "FLOP") == "1.5 PFLOP"
    assert si(124_439_808) == "124 M"  # GPT-2 small's parameters
    assert si(80e9, "B") == "80 GB"
    assert si(-2_500) == "-2.5 k"
    assert si(999) == "999" and si(0.5, "s") == "0.5 s"


def test_binary_bytes():
    assert binary(3 * 2**30) == "3.00 GiB"
    assert binary(2**28 - 2**20) == "255.0 MiB"  # below a quarter GiB: MiB
    assert binary(1.5 * 2**40) == "1.5 TiB"


def test_count():
    assert count(1_234_567.6) == "1,234,568"
