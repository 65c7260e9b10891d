"""deliverables.common: the one Markdown table of the deliverables, against hand-written Markdown; the one template
filler, its wrapped lines joined where Markdown keeps none."""

from deliverables import common
from deliverables.common import render, table


def test_table_names_left_numbers_right():
    assert table(["model", "params", "GiB"], [["small", 124, None], ["x", "failed: out of memory"]], "lr") == (
        "| model | params | GiB |\n|---|---:|---:|\n| small | 124 | - |\n| x | failed: out of memory |")


def test_table_alignment_letters_repeat_the_last():
    assert table(["a", "b", "c", "d"], [], "lrl").splitlines()[1] == "|---|---:|---|---|"
    assert table(["a", "b"], [], "r").splitlines()[1] == "|---:|---:|"
    assert table(["a", "b"], []).splitlines()[1] == "|---|---|"


def test_a_template_joins_wrapped_lines_but_keeps_lists_tables_headings_fences_and_fields_alone(tmp_path, monkeypatch):
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "page.md").write_text(
        "# A {title}\nwith text\n\nA wrapped\nparagraph, {n:,} and {n!r}.\n- an item\nwrapped\n- another\n{rows}\n"
        "text after a field\n| a |\n|---|\n\n```bash\n{command}\n```\n")
    (tmp_path / "pages" / "blocks.md").write_text("<!-- a -->\nnot this\n<!-- b -->\n one\nline {x-y}\n\n{no}\n\nend\n")
    monkeypatch.setattr(common, "__file__", str(tmp_path / "common.py"))
    assert render("page.md", title="page", n=1234, rows="| r |", command="ls") == (
        "# A page\nwith text\n\nA wrapped paragraph, 1,234 and 1234.\n- an item wrapped\n- another\n| r |\n"
        "text after a field\n| a |\n|---|\n\n```bash\nls\n```\n")
    assert render("blocks.md", "b", **{"x-y": ["two", "lines"], "no": ""}) == " one line two\nlines\n\nend\n"
