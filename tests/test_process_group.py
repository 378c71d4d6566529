"""The kill -9 tests' judge of a process group's leftovers (`tests/support/process_group.py`)."""

import os
import signal
import subprocess
import time

from tests.support.process_group import living_members, process_state, wait_until_gone


def test_a_running_member_is_left_and_a_zombie_is_not():
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert [line.split()[0] for line in living_members(child.pid)] == [str(child.pid)]
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while process_state(child.pid)[0] != "Z":
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.05)
        os.killpg(child.pid, 0)  # the kernel still counts the unreaped zombie in its group
        assert wait_until_gone(child.pid, 5.0) == []
    finally:
        child.kill()
        child.wait()
    assert living_members(child.pid) == []
