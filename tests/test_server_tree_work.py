"""The Responses API's tree work runs off the event loop, one piece at a time per tree: the
loop keeps ticking while a slow render runs, and two pieces of work on one tree never overlap
while work on another tree runs beside them."""

from __future__ import annotations

import asyncio
import threading
import time

from forkv.graph import Tree
from forkv.server.response_run import tree_lock, tree_work


def test_the_event_loop_runs_while_tree_work_does():
    tree = Tree()

    def slow_render() -> str:
        time.sleep(0.3)  # a deep conversation's render, standing in
        return threading.current_thread().name

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        name = await tree_work(tree, slow_render)
        task.cancel()
        return name, ticks

    name, ticks = asyncio.run(main())
    assert name != threading.main_thread().name
    assert ticks >= 10  # the loop was free (inline, it would not have ticked at all)


def test_work_on_one_tree_is_serial_and_other_trees_run_beside_it():
    one, other = Tree(), Tree()
    inside = {id(one): 0, id(other): 0}
    most = {id(one): 0, id(other): 0}
    lock = threading.Lock()

    def work(tree) -> None:
        with lock:
            inside[id(tree)] += 1
            most[id(tree)] = max(most[id(tree)], inside[id(tree)])
        time.sleep(0.05)
        with lock:
            inside[id(tree)] -= 1

    async def main():
        t0 = time.perf_counter()
        await asyncio.gather(*(tree_work(t, work, t) for t in (one, one, one, other, other)))
        return time.perf_counter() - t0

    took = asyncio.run(main())
    assert most == {id(one): 1, id(other): 1}
    assert took < 0.05 * 5  # the two trees' work overlapped
    assert tree_lock(one) is tree_lock(one) and tree_lock(one) is not tree_lock(other)
