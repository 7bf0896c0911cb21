"""The documentation's own rules (issue 47): code states rules and the record keeps the measurements,
the README stays a short user's guide, and the links between the pages lead somewhere.

A docstring or comment in speech/ may name a figure (a limit, a constant, a fact it relies on) and point
to docs/decisions.md or bench/RESULTS.md; it may not carry a benchmark series: two or more measured
figures (ms, µs, %, x) on one line, an arrow between figures (before -> after), or a slash series of
decimals (0.225 / 0.228)."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT_BYTES = 15 * 1024

NUMBER = r"\d+(?:\.\d+)?"
# A measured figure: a number or a range with a unit of time, share or ratio (not `0x04` or `16 MiB`).
FIGURE = re.compile(rf"(?<![\w.]){NUMBER}(?:\s?[-–]\s?{NUMBER})?\s?(?:ms|µs|%|x|×)(?![A-Za-z0-9])")
ARROW = re.compile(rf"(?<![\w.]){NUMBER}\s?(?:ms|µs|%|x|×|s)?\s*(?:→|->)\s*{NUMBER}")
SERIES = re.compile(r"\d+\.\d+\s?/\s?\d+\.\d+")


def comment_lines(source):
    """(line number, text) of every comment and every line of every docstring in a module's source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                first = node.body[0].lineno
                for offset, line in enumerate(docstring.splitlines()):
                    yield first + offset, line


def carries_figures(line):
    return len(FIGURE.findall(line)) >= 2 or ARROW.search(line) is not None or SERIES.search(line) is not None


def figure_lines(source):
    return sorted((number, line.strip()) for number, line in comment_lines(source) if carries_figures(line))


@pytest.mark.parametrize(
    "line",
    [
        "# 4 sessions at once took 2.2x pcm's wall time for mp3 against 1.8x at +5",
        "the loop's CPU per audio second 0.225 / 0.228 / 0.242 ms",
        "p50 from the connect 20 -> 50 ms beside 2,000 idle sessions",
        "session.configured p50 1.3-1.45 → 0.9 ms",
        "audio per wall second 0.6-1.3 % higher, CPU 3-6 % lower",
    ],
)
def test_a_benchmark_series_is_seen(line):
    assert carries_figures(line)


@pytest.mark.parametrize(
    "line",
    [
        "# a segment's first streamed frame: 40 ms",
        "A `session.config` may be 16 MiB, and later frames at most 128 KiB",
        "Ogg's CRC-32 (polynomial 0x04c11db7, not reflected)",
        "started (refused connection, dropped before the response, 502/503/504)",
        "its figures: docs/decisions.md#jobs-handed-over-to-the-synthesis-threads and bench/RESULTS.md",
        "4xx -> BadRequestError 400, 429 -> rate_limit_error",
        "`⑵` -> `(2)`, full-width letters -> ASCII",
    ],
)
def test_a_rule_a_fact_or_a_pointer_is_not_a_series(line):
    assert not carries_figures(line)


def test_the_check_reads_comments_and_docstrings_not_code():
    source = '"""Module: 0.29 -> 0.27 ms."""\n\nLIMITS = (40, 200)  # 1.2x / 1.3x\n\n\ndef f():\n    return "3 ms, 4 ms"\n'
    assert figure_lines(source) == [(1, "Module: 0.29 -> 0.27 ms."), (3, "# 1.2x / 1.3x")]


def test_no_docstring_or_comment_in_speech_carries_a_benchmark_series():
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / "speech").rglob("*.py"))
        if (hits := figure_lines(path.read_text()))
    }
    assert found == {}, "figures belong in docs/decisions.md or bench/RESULTS.md, with a pointer here"


def test_the_readme_is_a_short_users_guide():
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_LIMIT_BYTES, f"README.md is {size} bytes; move reference material to docs/"


def test_the_contributing_section_states_the_commit_message_rule():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## Contributing\n") :]
    section = section[: section.index("\n## ", 1)]
    assert "at most 72 characters" in section and "body" in section


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown):
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_between_pages_leads_somewhere(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not followed here
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert broken == []


def test_the_code_points_only_to_decisions_that_exist():
    known = anchors((ROOT / "docs" / "decisions.md").read_text())
    pointers = {
        (str(path.relative_to(ROOT)), anchor)
        for path in (ROOT / "speech").rglob("*.py")
        for anchor in re.findall(r"docs/decisions\.md#([\w\-]+)", path.read_text())
    }
    assert {(where, anchor) for where, anchor in pointers if anchor not in known} == set()


CODE_PATH = re.compile(r"`((?:speech|tests|bench|ttsproject)/[\w/.\-]*)`")


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_module_a_page_names_exists(page):
    """A module moved or renamed takes its pages with it."""
    assert sorted({path for path in CODE_PATH.findall(page.read_text()) if not (ROOT / path).exists()}) == []
