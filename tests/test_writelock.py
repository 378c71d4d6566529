"""The crawl's writer lock: the pure rule (`crawler.writelock`) on exact times, its file store
(`jobs.writelock`) on a local folder and on S3 (moto, conditional writes), raced by threads. No Spark.

Expiry, the takeover grace and the fence are timing rules: they run on a virtual clock, checked at their
boundaries with no sleeping. The races and the renewal thread run on the real clock."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace

import pytest

from crawler import layout
from crawler.errors import EXIT_TRY_LATER, CrawlBusy, TryLater
from crawler.ownership import may_take
from crawler.writelock import LockRecord, fence_deadline, holder, next_look, refusal, renew_interval
from jobs.writelock import LockFiles, S3LockFiles, acquire, check_held, writer_lock
from tests.support.s3 import moto_server
from tests.support.virtual import EPOCH, VirtualClock

TTL, GRACE = 8.0, 0.5  # binary fractions: exact sums on the virtual clock


def _record(**changes) -> LockRecord:
    base = LockRecord(epoch=3, command="generate", owner="o", hostname="box", pid=4242, acquired_at=EPOCH,
                      expires_at=EPOCH + 60.0)
    return replace(base, **changes)


def _never_sleep(seconds: float) -> None:
    raise AssertionError(f"slept {seconds} s on a virtual clock")


# --- the pure rule -------------------------------------------------------------------------------------------


def test_a_lock_is_free_when_never_held_released_or_expired_past_the_grace():
    held = _record()
    assert may_take(None, now=0.0, takeover_grace_s=GRACE)
    assert may_take(replace(held, released=True), now=EPOCH + 1, takeover_grace_s=GRACE)
    assert may_take(held, now=EPOCH + 1, takeover_grace_s=GRACE, holder_is_dead=True)
    assert not may_take(held, now=held.expires_at + GRACE - 2 ** -20, takeover_grace_s=GRACE)
    assert may_take(held, now=held.expires_at + GRACE, takeover_grace_s=GRACE)


def test_the_fence_comes_before_the_expiry_and_renewals_come_often_enough():
    assert fence_deadline(10.0, TTL) == 16.0 < 10.0 + TTL
    assert renew_interval(TTL) * 2 < fence_deadline(0.0, TTL)  # a renewal may fail: the next is in time
    assert next_look(5.0, 100.0) == 1.0 and next_look(5.0, 5.25) == 0.25 and next_look(6.0, 5.0) == 0.0


def test_the_refusal_is_one_line_naming_the_holder_and_since_when():
    line = refusal(_record(), 300.4, "/data/crawl")
    assert "\n" not in line
    assert "`crawl generate` (box/4242, since 2027-01-15T08:00:00Z)" in line
    assert "waited 300 s (writer_lock.wait_s)" in line and "/data/crawl" in line
    assert holder(_record(command="rebucket")).startswith("`crawl rebucket`")
    assert issubclass(CrawlBusy, TryLater) and EXIT_TRY_LATER == 75


# --- the file store ------------------------------------------------------------------------------------------


def _take(files, clock, command="generate", wait_s=0.0, sleep=_never_sleep):
    return acquire(files, command, "ROOT", wait_s, TTL, GRACE, clock, sleep)


@pytest.fixture(scope="module")
def s3():
    with moto_server() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def files(request, tmp_path):
    """A factory of lock stores (each a command's own view) on one root, local or on S3."""
    if request.param == "local":
        root = str(tmp_path / "root")
        return lambda: LockFiles(root)
    s3 = request.getfixturevalue("s3")
    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + "-lock"
    s3.make_bucket(bucket)
    return lambda: S3LockFiles(f"s3://{bucket}/crawl", s3.client())


def test_the_second_comer_is_refused_until_expiry_and_the_grace_then_takes_over_and_fences_the_first(files):
    clock = VirtualClock()
    first = _take(files(), clock)
    assert first.record.epoch == 1 and first.record.command == "generate"
    clock.now = 5.0
    assert first.renew() and first.record.expires_at == EPOCH + 5.0 + TTL
    with pytest.raises(CrawlBusy, match=r"busy: `crawl generate` \(.*/\d+, since .*\) holds its writer lock"):
        _take(files(), clock, "rebucket")
    clock.now = 5.0 + TTL * 0.75 - 2 ** -20
    first.check("a commit")  # before its fence, 3/4 of the ttl after its renewal started
    clock.now = 5.0 + TTL + GRACE - 2 ** -20
    with pytest.raises(CrawlBusy):
        _take(files(), clock, "rebucket")
    clock.now = 5.0 + TTL + GRACE
    second = _take(files(), clock, "rebucket")
    assert second.record.epoch == 2
    with pytest.raises(CrawlBusy, match="lost the crawl's writer lock .* before a commit"):
        first.check("a commit")
    first.lost = False  # as if its clock had been behind: the renewal finds the higher epoch all the same
    first.deadline = clock.now + 1
    assert not first.renew() and first.lost
    first.release()  # a lost lock is left alone
    assert second.renew() and files().read(2).command == "rebucket" and not files().read(2).released


def test_a_released_lock_is_taken_at_once_and_old_epochs_are_pruned(files):
    clock = VirtualClock()
    for epoch in range(1, 6):
        held = _take(files(), clock, f"command-{epoch}")
        assert held.record.epoch == epoch
        held.release()
        assert files().read(epoch).released
    assert files().epochs() == [3, 4, 5]


def test_a_renewal_of_an_epoch_replaced_behind_the_holders_back_loses_the_lock(files):
    clock = VirtualClock()
    held = _take(files(), clock)
    intruder = files()
    intruder.remove(1)
    assert intruder.write(replace(held.record, owner="intruder"), exclusive=True)
    if isinstance(intruder, S3LockFiles):  # S3: the holder's If-Match fails on the replaced object
        assert not held.renew() and held.lost
    else:  # a local holder finds out from a higher epoch
        assert intruder.write(replace(held.record, epoch=2, owner="intruder"), exclusive=True)
        assert not held.renew() and held.lost


def test_exactly_one_of_many_commands_racing_for_the_lock_wins(files):
    contenders = 6
    barrier = threading.Barrier(contenders)
    outcomes: list = []

    def take(command: str) -> None:
        barrier.wait()
        try:
            outcomes.append(acquire(files(), command, "ROOT", 0.0, 600.0, GRACE))
        except CrawlBusy as refused:
            outcomes.append(refused)

    threads = [threading.Thread(target=take, args=(f"c{n}",)) for n in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [o for o in outcomes if not isinstance(o, CrawlBusy)]
    assert len(outcomes) == contenders and len(winners) == 1
    assert files().epochs() == [1] and files().read(1).owner == winners[0].record.owner


def test_a_waiting_command_gets_the_lock_once_the_holder_lets_go(files):
    clock = VirtualClock()
    held = _take(files(), clock)
    looks: list[float] = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        clock.now += seconds
        if clock.now >= 3.0:
            held.release()

    waiter = _take(files(), clock, "rebucket", wait_s=10.0, sleep=sleep)
    assert waiter.record.epoch == 2 and looks == [1.0, 1.0, 1.0]
    with pytest.raises(CrawlBusy, match=r"`crawl rebucket` .* waited 5 s"):  # its lease runs until 3 + 8
        _take(files(), clock, "update", wait_s=5.0, sleep=sleep)


# --- held around a command, renewed by a thread ----------------------------------------------------------


def test_the_holder_renews_the_lock_while_it_runs_and_releases_it_after(base_conf, tmp_path):
    """ttl 3 s held for 7 s: without the renewal thread a second comer would take it over. (With a ttl of 0.5 s,
    a renewal thread held up by ~0.2 s on a busy machine let the fence pass: a real clock only gives lower bounds.
    The rule's exact boundaries are checked on the virtual clock above.)"""
    root = str(tmp_path / "root")
    conf = base_conf.with_overrides({"writer_lock.ttl_s": 3.0, "writer_lock.wait_s": 0.0,
                                     "ownership.takeover_grace_s": 0.0})
    with writer_lock(conf, root, "generate") as held:
        deadline = time.monotonic() + 7.0
        while time.monotonic() < deadline:
            with pytest.raises(CrawlBusy, match="`crawl generate`"), writer_lock(conf, root, "inject"):
                pass
            time.sleep(0.5)
        held.check("the last commit")
    assert LockFiles(root).read(held.record.epoch).released
    with writer_lock(conf, root, "inject") as after:
        assert after.record.epoch == held.record.epoch + 1
    assert LockFiles(root).epochs() == [1, 2] and layout.writer_lock_dir(root).endswith("locks/writer")


def test_the_lock_is_released_when_the_command_fails(base_conf, tmp_path):
    root = str(tmp_path / "root")
    conf = base_conf.with_overrides({"writer_lock.wait_s": 0.0})
    with pytest.raises(RuntimeError, match="boom"), writer_lock(conf, root, "rebucket"):
        raise RuntimeError("boom")
    assert LockFiles(root).read(1).released


def test_a_job_asks_before_a_commit_whether_its_thread_still_holds_the_lock(base_conf, tmp_path):
    root = str(tmp_path / "root")
    conf = base_conf.with_overrides({"writer_lock.wait_s": 0.0})
    with writer_lock(conf, root, "rebucket") as held:
        check_held(root, "rewriting urls")
        held.lost = True  # as a renewal that found a higher epoch leaves it
        with pytest.raises(CrawlBusy, match="before rewriting urls"):
            check_held(root, "rewriting urls")
    check_held(root, "anything")  # not holding it: nothing to check
