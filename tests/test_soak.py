"""The soak's reduced form (bench/soak.py --minutes 5): two instances sharing Redis under mixed load (real-time
streaming with barge-ins, word by word, REST one-shots, vanishing clients, fuzzed frames, Redis restarted
at half time) leave nothing to clean up. Only the zero counts are asserted; its timings (RSS per minute,
first audio over time) are in its output and, for a full run, in bench/RESULTS.md."""

from __future__ import annotations

import pytest

from tests.support import soak_run

pytestmark = pytest.mark.live


@pytest.mark.timeout(soak_run.WAIT_S)  # run alone, the test waits the soak's whole five minutes
def test_five_minutes_of_mixed_load_leave_nothing_to_clean_up():
    counts, output = soak_run.result()
    print(output)  # the report, for the record (pytest -s)
    assert counts["tracebacks"] == 0, output[-6000:]
    assert counts["problems"] == []  # answers outside the contract
    assert counts["accepted"] > 0 and counts["lost"] == 0
    assert counts["stale_rows"] == 0 and counts["stale_after_stop"] == 0  # registry rows still `active`
    assert counts["exit_codes"] == [0, 0]  # both stopped cleanly on SIGTERM
    assert counts["client_errors"] == [] and counts["rest_failed"] == []
    assert all(counts["sessions"].get(kind, 0) > 0 for kind in ("streaming", "word by word", "REST one-shot", "vanished"))
