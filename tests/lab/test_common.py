"""deliverables.common.table: the one Markdown table of the deliverables, against hand-written Markdown."""

from deliverables.common import table


def test_table_names_left_numbers_right():
    assert table(["model", "params", "GiB"], [["small", 124, None], ["x", "failed: out of memory"]], "lr") == (
        "| model | params | GiB |\n|---|---:|---:|\n| small | 124 | - |\n| x | failed: out of memory |")


def test_table_alignment_letters_repeat_the_last():
    assert table(["a", "b", "c", "d"], [], "lrl").splitlines()[1] == "|---|---:|---|---|"
    assert table(["a", "b"], [], "r").splitlines()[1] == "|---:|---:|"
    assert table(["a", "b"], []).splitlines()[1] == "|---|---|"
