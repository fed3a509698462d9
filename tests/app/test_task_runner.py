"""The window's task runner: the newest task wins, and a task that outlives its runner
(a window closed while it ran) ends without a traceback."""

from __future__ import annotations

import threading

import shiboken6

from gradexplorer_app.run_worker import TaskRunner, thread_pool


def test_the_newest_task_wins_and_an_older_result_is_dropped(qtbot):
    runner = TaskRunner("t")
    release = threading.Event()
    results: list[object] = []
    runner.finished.connect(lambda gen, result, s: results.append(result))
    runner.start(lambda progress, cancel: release.wait(30) and "old")
    with qtbot.waitSignal(runner.finished, timeout=30000):
        runner.start(lambda progress, cancel: "new")
    release.set()
    assert runner.shutdown(30000)
    qtbot.wait(50)
    assert results == ["new"]


def test_a_task_that_outlives_its_runner_ends_without_a_traceback(qtbot, capfd):
    runner = TaskRunner("t")
    started, release = threading.Event(), threading.Event()

    def task(progress, cancel):
        started.set()
        release.wait(30)
        progress("late", 1, 1)
        return "done"

    runner.start(task)
    assert started.wait(30)
    shiboken6.delete(runner)  # the runner and the signals it owned are gone, the task runs on
    release.set()
    assert thread_pool().waitForDone(30000)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "RuntimeError" not in err, err
