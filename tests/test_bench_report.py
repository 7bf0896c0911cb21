"""bench/report.py's `write_section`: a benchmark replaces its own section of bench/RESULTS.md and leaves
the others as they were, each heading after a blank line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Loaded from its file: bench/ is not a package, and on sys.path its modules would shadow others'.
_spec = importlib.util.spec_from_file_location("report", Path(__file__).resolve().parent.parent / "bench" / "report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)


def test_a_section_is_replaced_in_place_and_the_next_heading_keeps_its_blank_line(tmp_path, monkeypatch):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## A (a.py)\n\nold a\n\n## B (b.py)\n\nb\n")
    monkeypatch.setattr(report, "RESULTS", results)
    report.write_section("## A (a.py)", "## A (a.py)\n\nnew a\n")
    assert results.read_text() == "# Benchmark results\n\n## A (a.py)\n\nnew a\n\n## B (b.py)\n\nb\n"
    report.write_section("## C (c.py)", "## C (c.py)\n\nc\n")
    assert results.read_text().endswith("\n\nb\n\n## C (c.py)\n\nc\n")
