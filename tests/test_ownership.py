"""Bucket ownership: the pure lease rule (`crawler.ownership`) and its file store
(`fetchd.ownership`) on a real directory, raced by real OS processes. No Spark, no network.

Expiry, the takeover grace and fencing are timing rules: the store runs on a virtual clock there
(`tests/support/virtual.py`), so each is checked exactly at its boundary, with no sleeping. The races between
processes and threads run on the real clock with leases far longer than the test.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import threading
import time
from dataclasses import replace

import pytest

from crawler import config as config_mod
from crawler.ownership import LeaseRecord, check_timing, fence_deadline, may_take, previous_last_end
from fetchd.ownership import Lease, LeaseStore, leases_dir
from tests.support.virtual import EPOCH, VirtualClock

TTL, RENEW, MARGIN, GRACE = 0.75, 0.25, 0.125, 0.5  # binary fractions: exact sums on the virtual clock
BUCKET = 3
SPAWN = multiprocessing.get_context("spawn")


def _record(**changes) -> LeaseRecord:
    base = LeaseRecord(bucket=BUCKET, epoch=4, owner="a", hostname="h", pid=1, acquired_at=100.0, expires_at=160.0)
    return replace(base, **changes)


def _short_conf(**extra: float) -> config_mod.Config:
    values = {"lease_ttl_s": TTL, "renew_interval_s": RENEW, "fence_margin_s": MARGIN, "takeover_grace_s": GRACE}
    values.update(extra)
    return config_mod.load(assignments=[f"ownership.{k}={v}" for k, v in values.items()])


def _at_wall(clock: VirtualClock, when: float) -> None:
    clock.now = when - EPOCH


def _epoch_files(root: str, bucket: int = BUCKET) -> list[str]:
    return sorted(os.listdir(leases_dir(root, bucket)))


# --- the pure rule -------------------------------------------------------------------------------------------


def test_may_take_free_released_and_dead_holders_at_once():
    assert may_take(None, now=0.0, takeover_grace_s=5.0)
    valid = _record()
    assert may_take(replace(valid, released=True), now=101.0, takeover_grace_s=5.0)
    assert may_take(valid, now=101.0, takeover_grace_s=5.0, holder_is_dead=True)
    assert not may_take(valid, now=101.0, takeover_grace_s=5.0)


def test_may_take_expired_lease_only_after_the_grace():
    record = _record(expires_at=160.0)
    assert not may_take(record, now=159.9, takeover_grace_s=5.0)
    assert not may_take(record, now=160.0, takeover_grace_s=5.0)  # expired, but within the clock-skew grace
    assert not may_take(record, now=164.9, takeover_grace_s=5.0)
    assert may_take(record, now=165.0, takeover_grace_s=5.0)
    assert may_take(record, now=160.0, takeover_grace_s=0.0)


def test_fence_deadline_is_renew_start_plus_ttl_minus_margin():
    assert fence_deadline(1000.0, ttl_s=60.0, fence_margin_s=15.0) == 1045.0
    # The owner stops before any successor could start, even with no grace: deadline < start + ttl <= expiry.
    assert fence_deadline(1000.0, 60.0, 15.0) < 1000.0 + 60.0


def test_previous_last_end_by_how_the_lease_ended():
    assert previous_last_end(None, now=200.0, holder_is_dead=False) is None
    released = _record(released=True, expires_at=130.0, last_request_end=129.5)
    assert previous_last_end(released, now=200.0, holder_is_dead=False) == 129.5
    assert previous_last_end(replace(released, last_request_end=None), now=200.0, holder_is_dead=False) is None
    held = _record(expires_at=160.0)
    assert previous_last_end(held, now=120.0, holder_is_dead=True) == 120.0  # died before its lease ran out
    assert previous_last_end(held, now=170.0, holder_is_dead=True) == 160.0  # fencing stopped it at expiry anyway
    assert previous_last_end(held, now=170.0, holder_is_dead=False) == 160.0  # expired: fenced before expiry


def test_check_timing():
    assert check_timing(60.0, 15.0, 15.0) is None
    assert check_timing(1.0, 0.25, 0.5) is None  # exactly two renewal tries before the fence
    assert check_timing(1.0, 0.26, 0.5)[0] == "ownership.renew_interval_s"
    assert check_timing(1.0, 0.1, 1.0)[0] == "ownership.fence_margin_s"
    assert check_timing(1.0, 0.1, 2.0)[0] == "ownership.fence_margin_s"


@pytest.mark.parametrize(("assignments", "key"), [
    (["ownership.fence_margin_s=60.0"], "ownership.fence_margin_s"),
    (["ownership.lease_ttl_s=10.0", "ownership.fence_margin_s=2.0"], "ownership.renew_interval_s"),
    (["ownership.renew_interval_s=0"], "ownership.renew_interval_s"),
    (["ownership.takeover_grace_s=-1"], "ownership.takeover_grace_s"),
])
def test_config_rejects_unworkable_lease_timing(assignments, key):
    with pytest.raises(config_mod.ConfigError) as err:
        config_mod.load(assignments=assignments)
    assert err.value.key == key
    assert key in str(err.value)


def test_shipped_defaults_pass_the_timing_rule():
    conf = config_mod.load()
    assert check_timing(conf.ownership.lease_ttl_s, conf.ownership.renew_interval_s,
                        conf.ownership.fence_margin_s) is None


# --- the file store ----------------------------------------------------------------------------------------


def test_first_acquire_is_epoch_one_and_a_valid_lease_is_not_taken(root):
    conf = _short_conf()
    a, b = LeaseStore(conf, root, "a"), LeaseStore(conf, root, "b")
    lease = a.try_acquire(BUCKET)
    assert lease is not None and lease.record.epoch == 1 and lease.previous_end is None
    assert (lease.record.owner, lease.record.pid, lease.record.hostname) == ("a", os.getpid(), socket.gethostname())
    assert _epoch_files(root) == ["epoch-0000000001.json"]
    assert b.latest(BUCKET) == lease.record
    assert b.try_acquire(BUCKET) is None
    assert a.try_acquire(BUCKET) is None  # not even its own owner takes a second epoch while it is valid
    assert _epoch_files(root) == ["epoch-0000000001.json"]  # no stray temp files either


def test_expired_lease_is_taken_only_after_the_grace_and_the_old_owner_loses_it(root):
    conf, clock = _short_conf(), VirtualClock()
    a, b = LeaseStore(conf, root, "a", clock), LeaseStore(conf, root, "b", clock)
    first = a.try_acquire(BUCKET)
    expires = first.record.expires_at
    assert expires == clock.wall() + TTL

    _at_wall(clock, expires)
    assert b.try_acquire(BUCKET) is None  # expired, but within the grace
    _at_wall(clock, expires + GRACE - 2 ** -20)
    assert b.try_acquire(BUCKET) is None  # still within it, to the last moment

    _at_wall(clock, expires + GRACE)
    second = b.try_acquire(BUCKET)
    assert second is not None and second.record.epoch == 2 and second.record.owner == "b"
    assert second.previous_end == expires  # the old owner was fenced before its expiry

    assert first.fenced()
    assert a.renew(first) is False and first.lost
    assert b.latest(BUCKET) == second.record  # the loser's renewal did not disturb the new epoch
    assert b.renew(second) is True


def test_renewal_sees_a_higher_epoch_even_before_its_own_deadline(root):
    """A successor whose wall clock runs ahead (beyond the skew the grace allows) takes over early: the old
    owner, still inside its own fence deadline, must learn at its next renewal that it lost the bucket."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    clock = VirtualClock()
    a, b = LeaseStore(conf, root, "a", clock), LeaseStore(conf, root, "b", VirtualClock(now=60.0))
    first = a.try_acquire(BUCKET)
    second = b.try_acquire(BUCKET)
    assert second is not None and second.record.epoch == 2
    assert not first.fenced()
    assert a.renew(first) is False and first.lost and first.fenced()
    assert a.latest(BUCKET) == second.record
    a.release(first, clock.wall())  # a lost lease is left alone by release
    assert a.latest(BUCKET) == second.record


def test_release_hands_over_at_once_with_the_last_request_end(root):
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    a, b = LeaseStore(conf, root, "a"), LeaseStore(conf, root, "b")
    first = a.try_acquire(BUCKET)
    released_at = time.time()
    a.release(first, released_at)
    assert first.lost and first.fenced()
    record = b.latest(BUCKET)
    assert record.released and record.last_request_end == released_at and record.expires_at >= released_at
    second = b.try_acquire(BUCKET)
    assert second is not None and second.record.epoch == 2
    assert second.previous_end == released_at
    assert a.renew(first) is False


def test_a_release_waits_for_a_renewal_in_flight_and_the_released_record_stays(root, monkeypatch):
    """The daemon renews in a thread and releases from its event loop: a release that comes while a renewal is
    still writing waits for it, so the renewal cannot overwrite the released record (the next daemon would wait
    for the lease to expire instead of taking the bucket at once); a renewal after the release writes nothing."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    a = LeaseStore(conf, root, "a")
    lease = a.try_acquire(BUCKET)
    in_write, go_on = threading.Event(), threading.Event()
    write = LeaseStore._write

    def slow_renewal_write(store, record, exclusive):
        if not record.released:
            in_write.set()
            assert go_on.wait(10)
        return write(store, record, exclusive)

    monkeypatch.setattr(LeaseStore, "_write", slow_renewal_write)
    renewed: list[bool] = []
    renewal = threading.Thread(target=lambda: renewed.append(a.renew(lease)))
    renewal.start()
    assert in_write.wait(10)
    release = threading.Thread(target=a.release, args=(lease, time.time()))
    release.start()
    release.join(0.3)
    assert release.is_alive()  # waiting for the renewal's write
    go_on.set()
    renewal.join(10)
    release.join(10)
    assert renewed == [True] and lease.lost
    assert a.latest(BUCKET).released
    assert a.renew(lease) is False and a.latest(BUCKET).released


def test_renewal_after_the_fence_deadline_is_refused_even_if_nobody_took_over(root):
    conf, clock = _short_conf(), VirtualClock()
    a = LeaseStore(conf, root, "a", clock)
    lease = a.try_acquire(BUCKET)
    assert lease.deadline == TTL - MARGIN
    clock.now = lease.deadline - 2 ** -20
    assert a.renew(lease) is True  # the last moment a renewal counts
    assert lease.deadline == clock.now + TTL - MARGIN
    on_disk = a.latest(BUCKET)
    clock.now = lease.deadline
    assert a.renew(lease) is False and lease.lost
    assert a.latest(BUCKET) == on_disk  # a refused renewal writes nothing: others still see it expire on time
    assert a.try_acquire(BUCKET) is None  # it must wait like anyone else
    _at_wall(clock, on_disk.expires_at + GRACE)
    again = a.try_acquire(BUCKET)
    assert again is not None and again.record.epoch == 2


def test_renewal_moves_the_fence_deadline(root):
    conf, clock = _short_conf(), VirtualClock()
    a = LeaseStore(conf, root, "a", clock)
    lease = a.try_acquire(BUCKET)
    old_deadline, old_expiry = lease.deadline, lease.record.expires_at
    assert not lease.fenced(old_deadline - 0.001) and lease.fenced(old_deadline)
    clock.now = 0.25
    assert a.renew(lease) is True
    assert lease.deadline == 0.25 + TTL - MARGIN > old_deadline
    assert not lease.fenced(old_deadline)
    assert lease.record.expires_at == old_expiry + 0.25 == a.latest(BUCKET).expires_at
    clock.now = lease.deadline - 2 ** -20
    assert not lease.fenced()
    clock.now = lease.deadline
    assert lease.fenced()  # no renewal: fenced at the deadline by its own clock


def test_lease_fenced_at_the_deadline():
    lease = Lease(_record(), deadline=50.0, previous_end=None)
    assert not lease.fenced(49.999)
    assert lease.fenced(50.0) and lease.fenced(51.0)
    lease.deadline = 80.0  # what a renewal does
    assert not lease.fenced(50.0)
    lease.lost = True
    assert lease.fenced(0.0)


def test_old_epochs_are_pruned(root):
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    stores = [LeaseStore(conf, root, name) for name in ("a", "b")]
    for round_no in range(7):
        store = stores[round_no % 2]
        lease = store.try_acquire(BUCKET)
        assert lease.record.epoch == round_no + 1
        store.release(lease, time.time())
    assert _epoch_files(root) == [f"epoch-{n:010d}.json" for n in (5, 6, 7)]


def test_latest_lists_again_when_the_highest_epoch_it_listed_was_pruned_before_its_read(root, monkeypatch):
    """A reader that listed epoch 1 as the highest and paused while later epochs came and pruned it reads the
    highest epoch now, not a missing file (seen in a loaded suite run: FileNotFoundError)."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    writer, reader = LeaseStore(conf, root, "writer"), LeaseStore(conf, root, "reader")
    for _ in range(5):
        writer.release(writer.try_acquire(BUCKET), time.time())
    assert "epoch-0000000001.json" not in _epoch_files(root)
    listings = iter([[1]])  # the paused reader's listing, then the real ones
    real = reader._epochs
    monkeypatch.setattr(reader, "_epochs", lambda bucket: next(listings, None) or real(bucket))
    assert reader.latest(BUCKET) == writer.latest(BUCKET) and reader.latest(BUCKET).epoch == 5


def test_stale_reader_cannot_revive_a_pruned_epoch(root, monkeypatch):
    """A daemon that read epoch 1 and then paused while epochs 2..5 came and went (epoch 2's file pruned) must
    not create epoch 2 again: the bucket belongs to the highest epoch."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    a, b, stale = (LeaseStore(conf, root, name) for name in ("a", "b", "stale"))
    lease = a.try_acquire(BUCKET)
    a.release(lease, time.time())
    seen = stale.latest(BUCKET)
    for _ in range(4):
        lease = b.try_acquire(BUCKET)
        b.release(lease, time.time())
    owner = a.try_acquire(BUCKET)
    assert owner.record.epoch == 6 and "epoch-0000000002.json" not in _epoch_files(root)
    monkeypatch.setattr(stale, "latest", lambda bucket: seen)  # the pause between its read and its write
    assert stale.try_acquire(BUCKET) is None
    assert "epoch-0000000002.json" not in _epoch_files(root)
    assert b.latest(BUCKET) == owner.record and a.renew(owner) is True


def test_lease_file_is_never_seen_half_written(root):
    """Renewals rewrite the epoch file and takeovers add new ones while a reader polls: every read parses."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    stop, writing = SPAWN.Event(), SPAWN.Event()
    writer = SPAWN.Process(target=_churn, args=(root, stop, writing))
    writer.start()
    try:
        reader = LeaseStore(conf, root, "reader")
        assert writing.wait(60), "the writer process never started writing"
        reads, deadline = 0, time.monotonic() + 1.5
        while time.monotonic() < deadline:
            folder = leases_dir(root, BUCKET)
            for name in os.listdir(folder) if os.path.isdir(folder) else ():
                if not name.endswith(".json") or name.startswith("."):
                    continue
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as fh:
                        data = json.load(fh)  # JSONDecodeError = a half-written file: the test fails
                except FileNotFoundError:
                    continue  # pruned between listing and opening
                assert LeaseRecord.from_json(data).bucket == BUCKET
                reads += 1
            if reader.latest(BUCKET) is not None:
                reads += 1
    finally:
        stop.set()
        writer.join(10)
    assert writer.exitcode == 0
    assert reads > 100


def _churn(root: str, stop, writing) -> None:
    """Writer process: renew as fast as possible and hand the bucket over now and then (`writing` is set once it
    has begun, so a slow start on a busy machine does not eat the reader's window)."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    store = LeaseStore(conf, root, "writer")
    ends = time.monotonic() + 10.0
    while not stop.is_set() and time.monotonic() < ends:
        lease = store.try_acquire(BUCKET)
        writing.set()
        for _ in range(20):
            if not store.renew(lease):
                raise SystemExit(1)
        store.release(lease, time.time())


# --- real races between OS processes ----------------------------------------------------------------------


ROUNDS, RACERS = 5, 8


def _racer(root: str, index: int, barrier, results) -> None:
    """Each round: all racers try at once, then the winner releases and the next round starts."""
    conf = _short_conf(lease_ttl_s=30.0, renew_interval_s=5.0, fence_margin_s=5.0)
    store = LeaseStore(conf, root, f"racer-{index}")
    for round_no in range(ROUNDS):
        barrier.wait(20)
        lease = store.try_acquire(BUCKET)
        results.put((round_no, index, lease.record.epoch if lease else None))
        barrier.wait(20)  # everyone has tried before the bucket is freed again
        if lease is not None:
            store.release(lease, time.time())
        barrier.wait(20)


def test_exactly_one_process_wins_each_epoch(root):
    barrier, results = SPAWN.Barrier(RACERS), SPAWN.Queue()
    procs = [SPAWN.Process(target=_racer, args=(root, i, barrier, results)) for i in range(RACERS)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=60) for _ in range(ROUNDS * RACERS)]
    for proc in procs:
        proc.join(20)
        assert proc.exitcode == 0
    winners = {}
    for round_no, index, epoch in outcomes:
        if epoch is not None:
            assert round_no not in winners, f"two winners in round {round_no}"
            winners[round_no] = (index, epoch)
    assert sorted(winners) == list(range(ROUNDS))
    assert [winners[r][1] for r in range(ROUNDS)] == list(range(1, ROUNDS + 1))
    last = LeaseStore(_short_conf(), root, "check").latest(BUCKET)
    assert last.epoch == ROUNDS and last.owner == f"racer-{winners[ROUNDS - 1][0]}" and last.released


def _hold(root: str, taken) -> None:
    """Child process: take the bucket with the default (long) lease and sleep on it."""
    store = LeaseStore(config_mod.load(), root, "child")
    if store.try_acquire(BUCKET) is not None:
        taken.set()
    time.sleep(30)


def test_dead_holder_is_taken_at_once_but_a_live_one_is_not(root):
    conf = config_mod.load()  # 60 s leases: any takeover below happens long before expiry
    parent = LeaseStore(conf, root, "parent")
    taken = SPAWN.Event()
    child = SPAWN.Process(target=_hold, args=(root, taken))
    child.start()
    try:
        assert taken.wait(20)
        held = parent.latest(BUCKET)
        assert held.owner == "child" and held.pid == child.pid
        assert parent.try_acquire(BUCKET) is None  # a sleeping, live holder keeps its bucket
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    before = time.time()
    lease = parent.try_acquire(BUCKET)
    assert lease is not None and lease.record.epoch == 2
    assert before <= lease.previous_end <= time.time() < held.expires_at  # its requests ended by its death


def test_holder_in_this_process_or_on_another_host_is_not_dead(root):
    conf = config_mod.load()
    mine = LeaseStore(conf, root, "one").try_acquire(BUCKET)
    assert mine is not None
    assert LeaseStore(conf, root, "two").try_acquire(BUCKET) is None  # same pid, other owner name: alive

    gone = SPAWN.Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join(10)
    foreign = replace(mine.record, bucket=BUCKET + 1, epoch=1, owner="far", hostname=socket.gethostname() + "-other",
                      pid=gone.pid, acquired_at=time.time(), expires_at=time.time() + 60.0)
    folder = leases_dir(root, BUCKET + 1)
    os.makedirs(folder)
    with open(os.path.join(folder, "epoch-0000000001.json"), "w", encoding="utf-8") as fh:
        json.dump(foreign.to_json(), fh)
    store = LeaseStore(conf, root, "here")
    assert store.try_acquire(BUCKET + 1) is None  # its pid means nothing on this host
    with open(os.path.join(folder, "epoch-0000000001.json"), "w", encoding="utf-8") as fh:
        json.dump(replace(foreign, hostname=socket.gethostname()).to_json(), fh)
    with open(os.path.join(folder, "epoch-0000000001.json"), "w", encoding="utf-8") as fh:
        json.dump(replace(foreign, hostname=socket.gethostname(), process_space="other-boot/pid:[1]").to_json(), fh)
    assert store.try_acquire(BUCKET + 1) is None  # same host name, other pid namespace (a container): alive
    with open(os.path.join(folder, "epoch-0000000001.json"), "w", encoding="utf-8") as fh:
        json.dump(replace(foreign, hostname=socket.gethostname()).to_json(), fh)
    assert store.try_acquire(BUCKET + 1).record.epoch == 2  # same pid on this host: gone, so taken at once


def test_threads_of_one_daemon_do_not_break_exclusivity(root):
    """Stores sharing one process (the pid check cannot tell them apart) still win each epoch exactly once."""
    conf = config_mod.load()
    wins: list[int] = []
    start = threading.Barrier(4)

    def race(name: str) -> None:
        store = LeaseStore(conf, root, name)
        start.wait(10)
        lease = store.try_acquire(BUCKET)
        if lease is not None:
            wins.append(lease.record.epoch)

    threads = [threading.Thread(target=race, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert wins == [1]


def test_a_daemon_forgets_a_lost_lease_and_keeps_a_live_one(root):
    """`OwnedBuckets.drop_lost` (the first thing a look for work does): a lease past its fence deadline is no
    longer owned (the look for work fetched it again and again, each fetch ending at once); a live one is."""
    from fetchd.services import OwnedBuckets

    conf, clock = _short_conf(), VirtualClock()
    store = LeaseStore(conf, root, "a", clock)
    owned = OwnedBuckets(store, bucketing=None, gates=None, clock=clock)
    assert owned.acquire(BUCKET) and owned.acquire(BUCKET + 1)
    lost, started = owned.leases[BUCKET], clock.wall()
    _at_wall(clock, started + RENEW)
    assert store.renew(owned.leases[BUCKET + 1])  # only this one: the other is not renewed in time
    _at_wall(clock, started + TTL - MARGIN)
    assert lost.fenced() and not owned.leases[BUCKET + 1].fenced()
    owned.drop_lost()
    assert list(owned.leases) == [BUCKET + 1]
