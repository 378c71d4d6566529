"""A killed process group's leftovers, read from /proc: what a kill -9 test asserts is gone."""

from __future__ import annotations

import os
import time


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of a process from /proc/PID/stat, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold anything
    except OSError:
        return None
    return fields[0], int(fields[2])


def living_members(pgid: int) -> list[str]:
    """The group's processes that still run, as "pid state command". A zombie is left out: it has exited and waits
    for its new parent (the machine's init, which reaps on its own schedule) to collect its status; `killpg(pgid,
    0)` still counts it, which made a slow reaper look like a process that outlived its driver."""
    living = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or (found := process_state(int(name))) is None:
            continue
        state, group = found
        if group != pgid or state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended while we read
            continue
        living.append(f"{name} {state} {command[:160]}")
    return living


def wait_until_gone(pgid: int, timeout_s: float) -> list[str]:
    """The group's living processes after waiting up to `timeout_s` for none to be left (empty: all gone)."""
    deadline = time.monotonic() + timeout_s
    while (living := living_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return living
