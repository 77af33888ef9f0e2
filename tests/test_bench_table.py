"""The benchmark's table: a served system's URL whole, and no KV figure it cannot know."""

import io

from rich.console import Console

from genfleet.bench.metrics import RunSummary
from genfleet.bench.run import _table


def _render(*rows: RunSummary) -> str:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(_table("burst", list(rows)))
    return console.export_text()


def _row(system: str, used: int, allocated: int) -> RunSummary:
    return RunSummary(system, 215.2, 7.37, 7.62, 9.69, 1.97, 1.71, 0.0574, used, allocated)


def _column(text: str, index: int) -> str:
    """A column's cells, the table's lines of each joined (a folded cell spans several)."""
    return "".join(
        line.split("│")[index].strip() for line in text.splitlines() if line.startswith("│")
    )


def test_a_served_url_is_shown_whole_and_its_kv_as_unknown() -> None:
    url = "http://127.0.0.1:8011"
    text = _render(_row(url, 0, 0), _row("genfleet bfloat16", 4389, 4528))
    assert "…" not in text  # nothing cut, headers included
    assert _column(text, 1) == url + "genfleetbfloat16"
    assert _column(text, -2).replace(" ", "") == "-4389/4528(97%)"
