"""Nothing is left behind: slow-tier files go after a run, on an exception and on Ctrl-C;
an unusable slow directory is one clear error before anything runs; a failed or
interrupted run reports nothing."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from autotm.frontend.capture import capture
from autotm.errors import SessionFailed
from autotm.runtime.session import ExecutorSession
from autotm.ir.plan import evict_all_activations_plan
from autotm.tiers import TierError, make_memory_system
from autotm.checks.validate import validate
from children import sigint_default, stop

SMALL_NET = """
import torch
from torch import nn

def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 32 * 32, 10))

def small_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
"""
_small = {}
exec(SMALL_NET, _small)  # the same definitions the subprocesses below run
small_net, small_batch = _small["small_net"], _small["small_batch"]


def _session(memory, mode="sync", graph=None):
    model = small_net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if graph is None:
        graph = capture(model, nn.CrossEntropyLoss(), opt, small_batch(), name="small")
    plan = evict_all_activations_plan(graph, mode)
    budget = validate(plan, graph).peak_fast_bytes
    return ExecutorSession(graph, plan, memory, model, opt, budget_bytes=budget), graph, plan


def _max_evicted(graph, plan) -> int:
    return max(graph.tensors[tp.id].nbytes for tp in plan.tensors if any(a.kind == "evict" for a in tp.actions))


def test_a_completed_run_leaves_nothing(tmp_path):
    with make_memory_system("cpu+file", slow_dir=str(tmp_path)) as memory:
        s, _, _ = _session(memory)
        for i in range(2):
            s.step(small_batch(i))
        assert s.report().bytes_to_slow > 0
        s.close()
        assert memory.slow_bytes_in_use() == 0
        assert os.listdir(memory.directory) == []  # the arena file is unlinked at creation
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_slow_tier_full_mid_run_is_one_clear_error_and_frees_everything(tmp_path, mode):
    model = small_net()
    graph = capture(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                    small_batch(), name="small")
    # room for two activations: the forward pass runs out of slow memory part way
    capacity = 2 * (_max_evicted(graph, evict_all_activations_plan(graph, mode)) + 8192)
    with make_memory_system("cpu+file", slow_dir=str(tmp_path), slow_capacity_bytes=capacity) as memory:
        s, _, _ = _session(memory, mode, graph)
        with pytest.raises(TierError, match="slow tier capacity exceeded"):
            s.step(small_batch())
        assert memory.slow_bytes_in_use() == 0
        # no partial result is reported, and the session does not go on
        with pytest.raises(SessionFailed, match="failed"):
            s.report()
        with pytest.raises(SessionFailed):
            s.step(small_batch())
        assert os.listdir(memory.directory) == []
    assert os.listdir(tmp_path) == []


def test_disk_full_is_one_clear_error(tmp_path, monkeypatch):
    with make_memory_system("cpu+file", slow_dir=str(tmp_path)) as memory:
        s, _, _ = _session(memory)

        def no_space(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", no_space)
        with pytest.raises(TierError, match="is full"):
            s.step(small_batch())
        assert memory.slow_bytes_in_use() == 0
        with pytest.raises(SessionFailed):
            s.report()
    assert os.listdir(tmp_path) == []


def test_keyboard_interrupt_inside_an_iteration_frees_everything(tmp_path):
    with make_memory_system("cpu+file", slow_dir=str(tmp_path)) as memory:
        s, _, _ = _session(memory)
        s.step(small_batch(0))
        calls = []
        real = memory.to_slow

        def interrupted(key, t):
            calls.append(key)
            if len(calls) == 3:  # Ctrl-C while the third activation is written
                raise KeyboardInterrupt
            return real(key, t)

        memory.to_slow = interrupted
        with pytest.raises(KeyboardInterrupt):
            s.step(small_batch(1))
        assert memory.slow_bytes_in_use() == 0
        with pytest.raises(SessionFailed, match="KeyboardInterrupt"):
            s.report()
    assert os.listdir(tmp_path) == []


def test_missing_slow_directory_is_a_clear_error_before_anything_runs(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(TierError, match="does not exist"):
        make_memory_system("cpu+file", slow_dir=str(missing))
    assert not missing.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_slow_directory_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(TierError, match="not writable"):
            make_memory_system("cpu+file", slow_dir=str(ro))
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o700)


CHILD = SMALL_NET + textwrap.dedent("""
import sys
from torch import nn
from autotm.frontend.capture import capture
from autotm.errors import SessionFailed
from autotm.runtime.session import ExecutorSession
from autotm.ir.plan import evict_all_activations_plan
from autotm.tiers import make_memory_system
from autotm.checks.validate import validate

memory = make_memory_system("cpu+file", slow_dir=sys.argv[1])
model = small_net()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
graph = capture(model, nn.CrossEntropyLoss(), opt, small_batch(), name="small")
plan = evict_all_activations_plan(graph, sys.argv[2])
s = ExecutorSession(graph, plan, memory, model, opt, budget_bytes=validate(plan, graph).peak_fast_bytes)
s.step(small_batch())
print("READY", memory.directory, flush=True)
batch = small_batch()
try:
    while True:
        s.step(batch)
except KeyboardInterrupt as e:
    import traceback
    # (a Ctrl-C between iterations leaves a consistent session; one inside ends it)
    inside = any(f.name == "run_iteration" for f in traceback.extract_tb(e.__traceback__))
    try:
        s.report()
        print("REPORTED", inside, memory.slow_bytes_in_use(), flush=True)
    except SessionFailed:
        print("NO REPORT", memory.slow_bytes_in_use(), flush=True)
    raise
""")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ctrl_c_mid_run_exits_non_zero_and_leaves_no_slow_directory(tmp_path, mode):
    slow = tmp_path / "slow"
    slow.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    p = subprocess.Popen([sys.executable, str(script), str(slow), mode], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        line = p.stdout.readline()
        assert line.startswith("READY"), (line, p.stderr.read() if p.poll() is not None else "")
        private = line.split()[1]
        assert os.path.isdir(private)
        time.sleep(0.3)  # training
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        stop(p)
    assert p.returncode != 0
    assert "KeyboardInterrupt" in err
    # interrupted inside an iteration (nearly always: it is where the time goes): no report,
    # and nothing of the iteration left in slow memory; between iterations: a report
    assert "NO REPORT 0" in out or "REPORTED False 0" in out, out
    assert not os.path.exists(private)
    assert os.listdir(slow) == []
