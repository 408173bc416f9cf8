"""WriteQueue: bounded without blocking, FIFO, drain, discard, stop; survives bugs."""

import threading

from forkv.security.writer import WriteItem, WriteQueue


def item(key: bytes, size: int = 10) -> WriteItem:
    return WriteItem(key, "global", bytes(size), b"{}")


def test_fifo_and_drain():
    done = []
    q = WriteQueue(lambda it: done.append(it.key), max_items=10, max_bytes=1 << 20)
    for i in range(5):
        assert q.offer(item(b"%d" % i))
    assert q.drain(5) and done == [b"0", b"1", b"2", b"3", b"4"] and q.num_items == 0
    q.stop()


class WaitLog(threading.Condition):
    """A Condition that notes which threads waited on it."""

    def __init__(self):
        super().__init__()
        self.waiters: list[int] = []

    def wait(self, timeout=None):
        self.waiters.append(threading.get_ident())
        return super().wait(timeout)


def test_full_queue_refuses_without_blocking():
    taken, gate = threading.Event(), threading.Event()
    q = WriteQueue(lambda it: (taken.set(), gate.wait(5)), max_items=2, max_bytes=100)
    q._cond = cond = WaitLog()
    assert q.offer(item(b"a")) and taken.wait(5)  # the writer holds "a": the queue is empty
    assert q.offer(item(b"b", 60)) and not q.offer(item(b"c", 60))  # bytes bound
    assert q.offer(item(b"d", 10)) and not q.offer(item(b"e", 1))  # count bound
    assert not q.offer(item(b"f"))
    assert threading.get_ident() not in cond.waiters  # refused at once, never waited for room
    gate.set()
    assert q.drain(5)
    q.stop()


def test_oversize_item_alone_is_accepted():
    done = []
    q = WriteQueue(lambda it: done.append(it.key), max_items=4, max_bytes=10)
    assert q.offer(item(b"big", 1000)) and q.drain(5) and done == [b"big"]
    q.stop()


def test_discard_while_writing_drops_the_rest():
    taken, gate, done = threading.Event(), threading.Event(), []
    q = WriteQueue(lambda it: (taken.set(), gate.wait(5), done.append(it.key)),
                   max_items=10, max_bytes=1 << 20)
    assert q.offer(item(b"a")) and taken.wait(5)  # "a" is being written
    assert q.offer(item(b"b")) and q.offer(item(b"c"))
    assert q.discard() == 2
    gate.set()
    q.stop()
    assert done == [b"a"] and not q.offer(item(b"z"))


def test_discard_before_writing_drops_everything():
    done = []
    q = WriteQueue(lambda it: done.append(it.key), max_items=10, max_bytes=1 << 20)
    with q._cond:  # the writer cannot take an item while we hold its lock
        for key in (b"a", b"b", b"c"):
            assert q.offer(item(key))
        assert q.discard() == 3
    q.stop()
    assert done == [] and not q.offer(item(b"z"))


def test_writer_survives_a_failing_write(caplog):
    done = []

    def write(it):
        if it.key == b"bad":
            raise RuntimeError("bug")
        done.append(it.key)

    q = WriteQueue(write, max_items=10, max_bytes=1 << 20)
    q.offer(item(b"bad"))
    q.offer(item(b"good"))
    assert q.drain(5) and done == [b"good"] and "unexpected error" in caplog.text
    q.stop()


def test_no_thread_until_first_offer():
    q = WriteQueue(lambda it: None, max_items=1, max_bytes=1)
    assert q._thread is None and q.drain(0.1)
    q.stop()
