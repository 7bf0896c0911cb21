"""The settings table (speech/conf.py) is the one source of the SPEECH_* settings: the full table in
docs/settings.md, the main ones in the README's Settings section, the settings module and
`manage.py check` all follow it.

Only the SPEECH_* rows of the docs are compared; DJANGO_*, DATABASE_URL, REDIS_URL, MEDIA_ROOT,
HOST and PORT are read by ttsproject/settings.py and the Makefile themselves."""

import os
import re
import subprocess
import sys
from pathlib import Path

import environ
import pytest

from speech.checks import check_speech_settings
from speech.conf import SETTINGS, conf, from_environment

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_DOC = ROOT / "docs" / "settings.md"
README = ROOT / "README.md"
ROW = re.compile(r"^\| `(SPEECH_[A-Z0-9_]+)` \| (.*?) \| (.*?) \|$")


def table_rows(text, where):
    """name -> (default cell, meaning cell) for the SPEECH_* rows of a settings table in text."""
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            name, default, meaning = match.groups()
            assert name not in rows, f"{name} is in {where}'s settings table twice"
            rows[name] = (default, meaning)
    return rows


def doc_rows():
    return table_rows(SETTINGS_DOC.read_text(), "docs/settings.md")


def readme_rows():
    """The README's Settings section lists the main settings only."""
    text = README.read_text()
    section = text[text.index("\n## Settings\n") :]
    return table_rows(section[: section.index("\n## ", 1)], "the README")


def expected_row(setting):
    return f"| `{setting.name}` | {setting.readme_default} | {setting.meaning} |"


def test_the_settings_page_names_every_setting_of_the_table_and_no_other():
    in_doc, in_table = set(doc_rows()), {setting.name for setting in SETTINGS}
    missing = "\n".join(expected_row(s) for s in SETTINGS if s.name not in in_doc)
    assert in_doc == in_table, f"docs/settings.md has extra {sorted(in_doc - in_table)}; add:\n{missing}"


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda setting: setting.name)
def test_the_settings_page_row_says_what_the_table_says(setting):
    rows = doc_rows()
    if setting.name in rows:  # a missing row fails the test above
        assert rows[setting.name] == (setting.readme_default, setting.meaning), f"the row should be:\n{expected_row(setting)}"


def test_the_readme_rows_are_settings_of_the_table_and_say_what_it_says():
    table = {setting.name: setting for setting in SETTINGS}
    rows = readme_rows()
    assert {"SPEECH_ENGINE", "SPEECH_REQUIRE_API_KEY"} <= set(rows), "the README lists the main settings"
    assert sorted(set(rows) - set(table)) == [], "the README names a setting speech/conf.py does not have"
    wrong = {
        name: expected_row(table[name])
        for name, cells in rows.items()
        if cells != (table[name].readme_default, table[name].meaning)
    }
    assert wrong == {}, "the README's rows should be as in speech/conf.py"


def test_the_readme_shows_the_defaults_as_written_in_the_table():
    shown = {setting.name: setting.readme_default for setting in SETTINGS}
    assert shown["SPEECH_MAX_QUEUE_WAIT_S"] == "`2`"
    assert shown["SPEECH_MAX_CONFIG_BYTES"] == "`16777216`"
    assert shown["SPEECH_REQUIRE_API_KEY"] == "`false`"
    assert shown["SPEECH_ENGINE"] == "`hibari`"


def test_the_environment_is_read_through_the_table(monkeypatch):
    for setting in SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
    assert from_environment(environ.Env()) == {setting.name: setting.default for setting in SETTINGS}
    monkeypatch.setenv("SPEECH_MAX_QUEUE_WAIT_S", "3.5")
    monkeypatch.setenv("SPEECH_MAX_SEGMENT_CHARS", "100")
    monkeypatch.setenv("SPEECH_REQUIRE_API_KEY", "true")
    monkeypatch.setenv("SPEECH_UPSTREAM_VOICES", "alloy,ash")
    read = from_environment(environ.Env())
    assert (read["SPEECH_MAX_QUEUE_WAIT_S"], read["SPEECH_MAX_SEGMENT_CHARS"]) == (3.5, 100)
    assert (read["SPEECH_REQUIRE_API_KEY"], read["SPEECH_UPSTREAM_VOICES"]) == (True, ["alloy", "ash"])


def test_every_setting_of_the_table_is_a_django_setting():
    from django.conf import settings

    assert [s.name for s in SETTINGS if not hasattr(settings, s.name)] == []


def test_conf_falls_back_to_the_tables_default(settings):
    del settings.SPEECH_MAX_SEGMENT_CHARS
    assert conf.MAX_SEGMENT_CHARS == 4096
    with pytest.raises(AttributeError):
        _ = conf.NOT_A_SETTING


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="only where a process's cores can be limited")
def test_the_default_workers_are_the_cores_the_process_may_use():
    """A container's cpuset (here: the process's affinity, set before the settings load) limits the
    default, not the host's core count."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); import django; django.setup(); "
        "from speech.conf import conf; print(conf.ENGINE_WORKERS)"
    )
    env = {key: value for key, value in os.environ.items() if key != "SPEECH_ENGINE_WORKERS"}
    env["DJANGO_SETTINGS_MODULE"] = "ttsproject.settings"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1"]


@pytest.mark.parametrize(
    "overrides, message, check_id",
    [
        ({"SPEECH_ENGINE": "nope"}, "SPEECH_ENGINE is 'nope'; it must be one of: fake, hibari, openai.", "speech.E001"),
        ({"SPEECH_ENGINE_WORKERS": 0}, "SPEECH_ENGINE_WORKERS must be at least 1.", "speech.E002"),
        ({"SPEECH_MAX_QUEUE_WAIT_S": 0}, "SPEECH_MAX_QUEUE_WAIT_S must be positive.", "speech.E003"),
        ({"SPEECH_IDLE_TIMEOUT_S": -1}, "SPEECH_IDLE_TIMEOUT_S must be positive.", "speech.E004"),
        ({"SPEECH_MAX_SEGMENT_CHARS": 0}, "SPEECH_MAX_SEGMENT_CHARS must be positive.", "speech.E004"),
        (
            {"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": "gpu-host"},
            (
                "SPEECH_ENGINE is 'openai' but SPEECH_UPSTREAM_URL is 'gpu-host'; it must be the http(s) base URL of an "
                "OpenAI-compatible speech server, e.g. http://gpu-host:8000/v1."
            ),
            "speech.E005",
        ),
        (
            {"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": "http://h/v1", "SPEECH_UPSTREAM_SAMPLE_RATE": 1},
            "SPEECH_UPSTREAM_SAMPLE_RATE must be one of: 8000, 16000, 22050, 24000, 44100, 48000.",
            "speech.E006",
        ),
        (
            {"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": "http://h/v1", "SPEECH_UPSTREAM_READ_TIMEOUT_S": 0},
            "SPEECH_UPSTREAM_READ_TIMEOUT_S must be positive.",
            "speech.E004",
        ),
        (
            {"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": "http://h/v1", "SPEECH_UPSTREAM_RETRIES": -1},
            "SPEECH_UPSTREAM_RETRIES must not be negative.",
            "speech.E007",
        ),
        (
            {"SPEECH_MAX_MESSAGE_BYTES": 10, "SPEECH_MAX_CONFIG_BYTES": 5},
            ("SPEECH_MAX_MESSAGE_BYTES is larger than SPEECH_MAX_CONFIG_BYTES; daphne's frame limit follows the larger one."),
            "speech.W001",
        ),
    ],
)
def test_each_rule_of_the_table_is_a_system_check(settings, overrides, message, check_id):
    settings.SPEECH_ENGINE = "fake"
    for name, value in overrides.items():
        setattr(settings, name, value)
    assert [(e.msg, e.id) for e in check_speech_settings(None)] == [(message, check_id)]


def test_upstream_settings_are_checked_only_for_the_upstream_engine(settings):
    settings.SPEECH_ENGINE, settings.SPEECH_UPSTREAM_URL, settings.SPEECH_UPSTREAM_RETRIES = "fake", "", -1
    assert check_speech_settings(None) == []
