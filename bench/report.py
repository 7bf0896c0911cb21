"""What every benchmark script shares: the machine's facts and its own section of RESULTS.md."""

import datetime
import os
import platform
import re
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine_facts():
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu or platform.processor() or "unknown",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a",
    }


def header(heading, command):
    """The first lines of a section: heading, date, machine, the command that made it."""
    facts = machine_facts()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [
        heading,
        "",
        f"* Date: {when}",
        f"* Machine: {facts['nproc']} CPUs ({facts['cpu']}), Python {facts['python']}, {facts['platform']}, "
        f"load average at the end {facts['load']}",
        f"* Command: `{command}`",
    ]


def write_section(heading, section_text):
    """Replace (or add) the section that starts with `heading`; other sections stay as they are."""
    if RESULTS.exists():
        text = RESULTS.read_text()
    else:
        text = (
            "# Benchmark results\n\nWritten by the scripts in `bench/` (`make bench`); each script replaces "
            "only its own section.\n"
        )
    pattern = re.compile(r"^" + re.escape(heading) + r"\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section_text.rstrip("\n") + "\n\n", text, count=1)  # a blank line before the next
    else:
        text = text.rstrip("\n") + "\n\n" + section_text
    RESULTS.write_text(text.rstrip("\n") + "\n")


def interval(statistic, rounds, confidence=0.9, resamples=2000):
    """A bootstrap interval of `statistic` over `rounds` paired rounds: `statistic(indexes)` computes the
    figure from the rounds at `indexes` (server and engine rounds of the same index together), and the
    rounds are drawn with replacement `resamples` times. This machine's speed drifts by tens of percent
    within an hour, so a figure near its target is read with this interval, not alone."""
    draw = np.random.default_rng(0)
    values = [statistic(draw.integers(0, rounds, rounds)) for _ in range(resamples)]
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))
