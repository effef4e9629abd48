"""Processes sharing a profile cache: one measures, the others wait and reuse what it
measured; a measuring process killed with SIGKILL neither blocks the others nor loses
what it had finished; the file stays intact."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys

import pytest

from autotm.profile.cache import ProfileCache
from children import stop
from test_profile import TINY_SOURCE, unique_keys

CHILD = TINY_SOURCE + '''
import json, os, sys, time
from autotm.profile import profile

g, inputs = tiny_graph()
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):  # start profiling together
    time.sleep(0.005)

def progress(done, total, what):
    print(("waiting " if what.startswith("waiting") else "tick ") + what, flush=True)
    if sys.argv[3:] == ["slow"]:  # (the kill test: time for another process to start and wait)
        time.sleep(1.0)

cm, st = profile(g, "cpu+file", sys.argv[1], inputs=inputs, return_stats=True, progress=progress,
                 move_sizes=(65536, 1048576), move_repeats=2, wake_rounds=1, executor_overhead=False)
print("RESULT " + json.dumps({"measured": st.measured, "hits": st.cache_hits,
                              "moves": st.move_samples_measured, "waited": st.waited_seconds,
                              "kernel_seconds": list(cm.kernel_seconds),
                              "wake": list(cm.wake_seconds)}), flush=True)
'''


def _start(script, cache, go, *extra):
    return subprocess.Popen([sys.executable, str(script), str(cache), str(go), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])


def _intact(path) -> None:
    db = sqlite3.connect(str(path))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    with ProfileCache(path) as c:
        assert c.rebuilt_reason is None


def _wait_for(proc, prefix: str) -> None:
    for line in proc.stdout:
        if line.startswith(prefix):
            return
    raise AssertionError(f"the child ended before printing {prefix!r}: {proc.stderr.read()[-2000:]}")


def test_two_processes_on_one_cache_measure_each_signature_once(tiny_graph_keys, tmp_path):
    cache, go, script = tmp_path / "c.sqlite", tmp_path / "go", tmp_path / "child.py"
    script.write_text(CHILD)
    procs = [_start(script, cache, go) for _ in range(2)]
    try:
        for p in procs:
            _wait_for(p, "ready")
        go.touch()
        a, b = (_result(p) for p in procs)
    finally:
        for p in procs:
            stop(p)
    # one of them timed every kernel and move, the other waited for it and reused all of it
    assert sorted([a["measured"], b["measured"]]) == [0, tiny_graph_keys]
    first, second = (a, b) if a["measured"] else (b, a)
    assert first["moves"] > 0 and second["moves"] == 0 and second["hits"] == tiny_graph_keys
    assert second["kernel_seconds"] == first["kernel_seconds"] and second["wake"] == first["wake"]
    _intact(cache)


def test_a_measuring_process_killed_leaves_the_rest_to_the_one_waiting(tiny_graph_keys, tmp_path):
    cache, go, script = tmp_path / "c.sqlite", tmp_path / "go", tmp_path / "child.py"
    script.write_text(CHILD)
    go.touch()
    first = _start(script, cache, go, "slow")
    second = None
    try:
        _wait_for(first, "tick")  # it holds the lock and has measured something
        second = _start(script, cache, go)
        _wait_for(second, "waiting")  # blocked on the first
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
        r = _result(second)
    finally:
        stop(first)
        if second is not None:
            stop(second)
    assert first.returncode == -signal.SIGKILL
    assert r["waited"] > 0
    # what the killed one had finished was reused, the rest measured by the one that waited
    assert r["moves"] + r["measured"] > 0
    assert r["hits"] + r["measured"] == tiny_graph_keys
    _intact(cache)


@pytest.fixture(scope="module")
def tiny_graph_keys():
    ns: dict = {}
    exec(TINY_SOURCE, ns)
    return unique_keys(ns["tiny_graph"]()[0])
