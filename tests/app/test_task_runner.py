"""The window's task runner: the newest task wins, a task that outlives its runner (a
window closed while it ran) ends without a traceback, and no task outlives the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import shiboken6

from gradexplorer_app import run_worker
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


def test_shutdown_all_cancels_every_runners_tasks_and_waits_for_them(qtbot):
    """Two runners, each with a task that runs until cancelled and then takes a while to
    return: ``shutdown_all`` returns once both have returned, not when they were told."""
    returned: list[str] = []

    def task(name):
        def fn(progress, cancel):
            started[name].set()
            while not cancel.is_set():
                cancel.wait(0.01)
            threading.Event().wait(0.2)  # the task's own clean-up, after the cancel
            returned.append(name)
        return fn

    started = {"a": threading.Event(), "b": threading.Event()}
    runners = [TaskRunner("a"), TaskRunner("b")]
    for runner, name in zip(runners, "ab", strict=True):
        runner.start(task(name))
    assert all(e.wait(30) for e in started.values())
    assert run_worker.running_tasks() == 2
    assert run_worker.shutdown_all(30)
    assert sorted(returned) == ["a", "b"] and run_worker.running_tasks() == 0


def test_a_task_running_when_the_interpreter_exits_is_cancelled_and_waited_for(tmp_path):
    """A script that ends while a task runs (a window closed during a graph layout, a kernel
    shut down during a capture): the task is cancelled and returns while the interpreter is
    whole, and the process exits cleanly. Nothing else would ever cancel this task: without
    the cancel and wait at exit the process hangs."""
    marker = tmp_path / "returned"
    script = tmp_path / "script.py"
    script.write_text(
        "import threading, sys\n"
        "from PySide6.QtCore import QCoreApplication\n"
        "app = QCoreApplication([])\n"
        "from gradexplorer_app.run_worker import TaskRunner\n"
        "started = threading.Event()\n"
        "def task(progress, cancel):\n"
        "    started.set()\n"
        "    while not cancel.is_set():\n"
        "        cancel.wait(0.01)\n"
        f"    open({str(marker)!r}, 'w').write('yes')\n"
        "runner = TaskRunner('t')\n"
        "runner.start(task)\n"
        "assert started.wait(30)\n"
        "print('leaving', flush=True)\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-X", "faulthandler", str(script)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout and marker.read_text() == "yes"
