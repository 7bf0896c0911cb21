"""Where the CPU goes in bench/throughput.py's rounds: CPU seconds per thread and of the machine from
/proc, the synthesis pool's job histograms (speech/metrics.py) of the server or of this process, and the
two tables that report them in bench/RESULTS.md. Linux only (/proc)."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_schedstat(pid, *, main=True):
    """{tid: (seconds on a CPU, seconds runnable but waiting for a CPU)} of each thread of `pid` (with
    main=False, all but its main one), to the nanosecond (Linux /proc/<pid>/task/<tid>/schedstat;
    /proc's stat counts in ticks of 10 ms, as much as a server's event loop spends in a round)."""
    times = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        if tid == pid and not main:
            continue
        try:
            on_cpu, run_queue = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):  # the thread ended, or no scheduler statistics
            continue
        times[tid] = (int(on_cpu) / 1e9, int(run_queue) / 1e9)
    return times


def machine_times():
    """(idle, total, steal) CPU seconds of the whole machine since boot: total is the time its CPUs ran
    or idled; steal, the time a hypervisor gave them to other guests, is not in it."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    ticks = os.sysconf("SC_CLK_TCK")
    return (fields[3] + fields[4]) / ticks, sum(fields[:7]) / ticks, fields[7] / ticks


def _on_cpu(pid):
    return {tid: times[0] for tid, times in thread_schedstat(pid).items()}


class CpuMeter:
    """CPU of one round, from when it is made to `read`: the server's event loop (main thread) and
    other threads, this process, the machine's idle, total and stolen CPU seconds."""

    def __init__(self, server_pid):
        self.pid = server_pid
        self.server = _on_cpu(server_pid)
        self.own = time.process_time()
        self.machine = machine_times()

    def read(self):
        server = _on_cpu(self.pid)
        spent = {tid: server[tid] - self.server.get(tid, 0.0) for tid in server}
        idle, total, steal = (now - then for now, then in zip(machine_times(), self.machine, strict=True))
        loop = spent.pop(self.pid, 0.0)
        return {
            "loop": loop,
            "threads": sum(spent.values()),
            "own": time.process_time() - self.own,
            "idle": idle,
            "total": total,
            "steal": steal,
        }


# Above this share of the machine's CPU time taken by other processes and the hypervisor, cpu_table flags the
# run as contended (bench/throughput.py on this 2-core machine, quiet: 0.0-1.3 % per row, steal 0.0-0.1 %).
CONTENDED_SHARE = 0.03

JOB_HISTOGRAMS = ("speech_engine_job_seconds", "speech_engine_job_wait_seconds")


def job_totals(server_url=None):
    """{histogram: (count, sum)} of the synthesis pool's job runs and waits (speech/metrics.py): the
    server's /metrics at `server_url`, or this process's registry (the raw engine's pool)."""
    if server_url is None:
        get = REGISTRY.get_sample_value
    else:
        with urllib.request.urlopen(server_url + "/metrics", timeout=30) as response:
            body = response.read().decode()
        samples = {s.name: s.value for family in text_string_to_metric_families(body) for s in family.samples}
        get = samples.get
    return {name: (get(name + "_count") or 0.0, get(name + "_sum") or 0.0) for name in JOB_HISTOGRAMS}


def job_round(jobs_before, jobs_after, sched_before, sched_after, wall_s):
    """(jobs, seconds run, seconds waited for a thread, wall seconds, seconds the threads other than the main
    one spent on a CPU, and runnable but waiting for one) of one round, from job_totals and
    thread_schedstat readings before and after it."""
    (runs, ran), (_, waited) = (
        (jobs_after[name][0] - jobs_before[name][0], jobs_after[name][1] - jobs_before[name][1]) for name in JOB_HISTOGRAMS
    )
    on_cpu, run_queue = (
        sum(times[k] - sched_before.get(tid, (0.0, 0.0))[k] for tid, times in sched_after.items()) for k in (0, 1)
    )
    return runs, ran, waited, wall_s, on_cpu, run_queue


def cpu_per_audio_s(rounds):
    """Each CPU figure of the rounds, summed, in ms per audio second; as shares of the machine's CPU time
    over all of them (one round is a few ticks of /proc/stat): idle, the rest of the machine (other
    processes and kernel threads: what the rounds' own processes did not use and did not leave idle),
    and steal."""
    audio = sum(seconds for _, seconds in rounds)
    spent = {key: sum(reading[key] for reading, _ in rounds) for key in ("loop", "threads", "own")}
    idle, total, steal = (sum(reading[key] for reading, _ in rounds) for key in ("idle", "total", "steal"))
    per_audio_s = {key: value * 1000 / audio for key, value in spent.items()}
    if not total:
        return per_audio_s | dict.fromkeys(("idle", "other", "steal"), float("nan"))
    other = max(0.0, total - idle - sum(spent.values()))
    return per_audio_s | {"idle": idle / total, "other": other / total, "steal": steal / (total + steal)}


def cpu_table(cpu, concurrency):
    """The lines of the CPU table: {C: {"s": [(CpuMeter reading, audio seconds) of each server round], "e": [...]}}."""
    lines = [
        "",
        "Where the CPU goes, in ms of CPU per audio second over the same rounds, from the text sent to the last "
        "audio (the handshakes before it left out: they are bench/handshake.py's), the time the throughput is "
        "measured over (server rounds: the server's event loop, its other threads, i.e. synthesis, and the "
        "client; engine rounds: this process, i.e. the engine's threads and its event loop), and the share of "
        "the machine's CPU time left idle, taken by the rest of the machine (other processes, kernel threads) and "
        "stolen by the hypervisor (the last two flag a contended run):",
        "",
        "| C | server: event loop | server: other threads | client | server + client | engine | "
        "(server + client) / engine | idle, server / engine rounds | rest of the machine | steal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    taken = 0.0  # the largest share of the machine taken from the rounds by others, in any row
    for c in concurrency:
        per = {key: cpu_per_audio_s(cpu[c][key]) for key in ("s", "e")}
        taken = max(taken, *(per[key]["other"] + per[key]["steal"] for key in ("s", "e")))
        served = per["s"]["loop"] + per["s"]["threads"] + per["s"]["own"]
        lines.append(
            f"| {c} | {per['s']['loop']:.2f} | {per['s']['threads']:.2f} | {per['s']['own']:.2f} | {served:.2f} | "
            f"{per['e']['own']:.2f} | {served / per['e']['own']:.3f} | "
            f"{per['s']['idle'] * 100:.1f} % / {per['e']['idle'] * 100:.1f} % | "
            f"{per['s']['other'] * 100:.1f} % / {per['e']['other'] * 100:.1f} % | "
            f"{per['s']['steal'] * 100:.1f} % / {per['e']['steal'] * 100:.1f} % |"
        )
    if taken > CONTENDED_SHARE:
        lines.append(
            f"\n**A contended run**: the rest of the machine and the hypervisor took up to {taken * 100:.1f} % of its CPU "
            f"time (above {CONTENDED_SHARE * 100:.0f} %), from both sides of the comparison but not always evenly: "
            "read its ratios with that in mind, or run it again on a quiet machine."
        )
    return lines


def jobs_table(jobs, concurrency, workers):
    """The lines of the job table: {C: {"s": [job_round() of each server round], "e": [...]}}."""
    lines = [
        "",
        "The synthesis jobs of the same rounds (the pool's `speech_engine_job_seconds` and "
        "`speech_engine_job_wait_seconds`, the same pool code on both sides): the mean time a job ran on a "
        "thread and waited for one, and how busy the threads were (time run over threads x the round's wall "
        "time, from the text sent to the last audio). A job's run splits, from /proc's scheduler statistics "
        "of the threads other than the main one (the synthesis threads, on both sides), into time on a CPU, "
        "time runnable but waiting for a CPU (the cores are busy with other threads and processes) and the "
        "rest: blocked (on the GIL, on a lock), less what those threads spent outside jobs, so it can be a little "
        "below zero. The server keeps each session's next segment queued "
        "(look-ahead), so its jobs wait longer for a thread by design.",
        "",
        "| C | jobs a round, server / engine | mean run ms, server / engine | run, server / engine | "
        "of a run (ms): on a CPU, server / engine | waiting for a CPU | rest (blocked) | "
        "mean wait for a thread (ms), server / engine | threads busy, server / engine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in concurrency:
        s, e = (np.array(jobs[c][key]).sum(axis=0) for key in ("s", "e"))  # see job_round
        run_s, run_e = s[1] / s[0] * 1000, e[1] / e[0] * 1000
        on_s, on_e = s[4] / s[0] * 1000, e[4] / e[0] * 1000
        queue_s, queue_e = s[5] / s[0] * 1000, e[5] / e[0] * 1000
        lines.append(
            f"| {c} | {s[0] / len(jobs[c]['s']):.0f} / {e[0] / len(jobs[c]['e']):.0f} | {run_s:.2f} / {run_e:.2f} | "
            f"{run_s / run_e:.3f} | {on_s:.2f} / {on_e:.2f} | {queue_s:.2f} / {queue_e:.2f} | "
            f"{run_s - on_s - queue_s:.2f} / {run_e - on_e - queue_e:.2f} | "
            f"{s[2] / s[0] * 1000:.2f} / {e[2] / e[0] * 1000:.2f} | "
            f"{s[1] / (workers * s[3]) * 100:.1f} % / {e[1] / (workers * e[3]) * 100:.1f} % |"
        )
    return lines
