"""Faults at seeded random points (issue 35, item 4): `autotm profile`, `plan`, `run`,
`bench` and a compiled training loop, each killed with SIGKILL or SIGINT after a delay drawn
from random.Random(SEED) within the command's measured duration. Afterwards the profile
cache passes SQLite's integrity check and autotm reads it without rebuilding it, every line
of the results store is a complete record, the next start of an autotm command removes the
slow directories of dead processes and keeps the one a live process holds, and a rerun of
the command completes. SIGINT exits 130 (or 0, when it came after the work).

The commands share one private cache and slow directory (module scope), so only `profile`
pays for a cold profile: the other commands are timed, killed and rerun on a warm cache.
A failure names the seed, the command, the signal and the delay: rerun with them.
"""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from budgets import feasible_ratio
from children import sigint_default, stop

SEED = 354


def rng(command):
    """The points of one command: the same whichever tests run."""
    return random.Random(f"{SEED}:{command}")

HOLDER = textwrap.dedent("""
    import sys, time
    from autotm.tiers import make_memory_system
    ms = make_memory_system("cpu+file")
    print(ms.directory, flush=True)
    time.sleep(3600)
""")

# a user's compiled training loop: an MLP whose synchronous plan at this budget keeps some
# weights in slow memory (tests/api/test_training_state.py), stepped until it is done. Its
# points lie after its imports: a Ctrl-C inside the user's own `import torch` is torch's to
# survive, not autotm's (it aborted the process once, from pybind11, on the CI machine)
TRAIN = textwrap.dedent("""
    import sys, torch
    from torch import nn
    import autotm
    print("imported", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128),
                          nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    with autotm.compile(model, nn.CrossEntropyLoss(), opt, (x, y), memory="cpu+file", budget=200_000,
                        formulation="synchronous") as step:
        for _ in range(200):
            loss = step(x, y)
    print("loss", float(loss), flush=True)
""")

# the smallest budget the planner fits on this CPU: whether 4:1 fits depends on the
# workspaces of the convolution algorithms oneDNN picks for it (not on an AVX2-only EPYC)
PLANNER = ("--budget", "min", "-f", "synchronous", "--time-limit", "5")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A private cache and slow directory for the module's processes, and a live process
    holding a slow directory there (it must survive every cleanup)."""
    root = tmp_path_factory.mktemp("faults")
    (root / "slow").mkdir()
    env = {**os.environ, "AUTOTM_CACHE_DIR": str(root / "cache"), "AUTOTM_SLOW_DIR": str(root / "slow")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        live = holder.stdout.readline().strip()
        assert os.path.isdir(live), live
        yield root, env, os.path.basename(live)
        assert holder.poll() is None  # (alive to the end: its directory was a live one)
    finally:
        stop(holder)


def start(argv, env, cwd):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            preexec_fn=sigint_default)


def cli(*args):
    return [sys.executable, "-m", "autotm.cli", *args]


def started(p, after_line):
    """The moment the clock starts: at once, or once the process printed `after_line`."""
    if after_line is not None:
        for line in p.stdout:
            if line.strip() == after_line:
                break
    return time.perf_counter()


def complete(argv, home, what, after_line=None):
    """Run to the end: exit 0. Returns its seconds (from `after_line`, where given)."""
    root, env, live = home
    p = start(argv, env, root)
    try:
        t0 = started(p, after_line)
        out, err = p.communicate(timeout=900)
        seconds = time.perf_counter() - t0
    finally:
        stop(p)
    assert p.returncode == 0, f"{what}: rc {p.returncode}\n{err[-3000:]}"
    check_state(home, what)
    return seconds


def interrupt(argv, home, sig, delay, what, python_exit=False, after_line=None):
    """Start argv, send `sig` `delay` seconds after it started (or printed `after_line`),
    check how it ended and what it left."""
    root, env, live = home
    before = set(os.listdir(root / "slow"))
    p = start(argv, env, root)
    try:
        t0 = started(p, after_line)
        try:
            p.wait(timeout=max(0.0, delay - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.send_signal(sig)
        out, err = p.communicate(timeout=300)
    finally:
        stop(p)
    rc = p.returncode
    print(f"{what}: rc {rc}")  # (with -s: where each point fell)
    if sig == signal.SIGKILL:
        assert rc in (-signal.SIGKILL, 0), f"{what}: rc {rc}\n{err[-3000:]}"
    elif python_exit:  # a plain script: Python dies of the SIGINT once its handlers ran
        assert rc in (-signal.SIGINT, 0), f"{what}: rc {rc}\n{err[-3000:]}"
    else:
        # the CLI: 130 and one line; or -SIGINT when the signal came before its main() began
        # (while Python imported it: a shell reads both as 130)
        assert rc in (130, -signal.SIGINT, 0), f"{what}: rc {rc}\n{err[-3000:]}"
        if rc == 130:
            assert "interrupted (Ctrl-C)" in err and "Traceback (most recent call last)" not in err, f"{what}:\n{err[-3000:]}"
    if sig == signal.SIGINT and rc != 0:
        # a Ctrl-C is cleaned up after: no slow directory of its own left
        assert set(os.listdir(root / "slow")) <= before, f"{what}: {os.listdir(root / 'slow')} ({before} before)"
    check_state(home, what, before_next_start=True)
    return rc


def check_state(home, what, before_next_start=False):
    root, env, live = home
    cache = root / "cache" / "profile.sqlite"
    if cache.exists():
        with sqlite3.connect(cache) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)], what
        db.close()
        from autotm.profile.cache import CacheWarning, ProfileCache

        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)  # (a rebuilt cache: it was not usable)
            with ProfileCache(cache) as pc:
                assert pc.rebuilt_reason is None, what
                for (env_key,) in pc._db.execute("SELECT env FROM environments").fetchall():
                    pc.kernel_times(env_key), pc.move_samples(env_key), pc.pending(env_key)
    from autotm.experiments.results import Record

    for store in (root / "results").glob("*.jsonl"):
        data = store.read_text(encoding="utf-8")
        assert data == "" or data.endswith("\n"), f"{what}: {store} ends in a torn record"
        for line in data.splitlines():
            d = json.loads(line)
            assert set(d) == set(Record.__dataclass_fields__), f"{what}: an incomplete record in {store}"
            Record.from_dict(d)
    names = sorted(os.listdir(root / "slow"))
    assert live in names, f"{what}: the live process's slow directory was removed"
    if not before_next_start:  # a command has started since: only the live one is left
        assert names == [live], f"{what}: {names} (the live one: {live})"


def where(what, sig, delay):
    return f"{what} {signal.Signals(sig).name} after {delay:.2f} s (SEED={SEED})"


def test_profile_killed_then_resumed(home):
    # a dead process's slow directory, there before any command starts
    root, env, live = home
    dead = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        dead_dir = dead.stdout.readline().strip()
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=60)
    finally:
        stop(dead)
    assert os.path.isdir(dead_dir)
    argv = cli("profile", "resnet50", "--json")
    # a cold profile takes minutes: both points lie within it (the capture, the measuring)
    points = rng("profile")
    for sig in (signal.SIGKILL, signal.SIGINT):
        delay = points.uniform(1.0, 15.0)
        rc = interrupt(argv, home, sig, delay, where("profile", sig, delay))
        assert rc != 0, where("profile", sig, delay) + ": a cold profile finished"
    complete(argv, home, "profile rerun")
    assert not os.path.exists(dead_dir)  # (check_state: nothing but the live one is left)


# one signal each (time): kill -9 where it can leave most behind (run's slow directory, a
# record bench is writing), Ctrl-C where the clean-up path is the user's (plan, a training loop)
@pytest.mark.parametrize("command, sig", [("plan", signal.SIGINT), ("run", signal.SIGKILL),
                                          ("bench", signal.SIGKILL), ("train", signal.SIGINT)])
def test_killed_at_a_random_point_then_rerun(home, command, sig, tmp_path):
    root, env, live = home
    if command == "train":
        script = tmp_path / "train.py"
        script.write_text(TRAIN)
        argv = [sys.executable, str(script)]
    elif command == "bench":
        ratio = feasible_ratio(str(root / "cache" / "profile.sqlite"), ("synchronous",))
        argv = cli("bench", "test", "--models", "resnet50", "--ratios", ratio, "-f", "all-fast,synchronous",
                   "-n", "1", "--time-limit", "5", "--out", str(root / "results"))
    else:
        argv = cli(command, "resnet50", *PLANNER, *(("-n", "1") if command == "run" else ()), "--json")
    after_line = "imported" if command == "train" else None
    points = rng(command)
    seconds = complete(argv, home, f"{command} (timing it)", after_line)
    delay = points.uniform(0.05, 1.0) * seconds
    what = where(command, sig, delay) + (" (after its imports)" if after_line else "")
    if command == "bench":  # (the sweep would skip the cells recorded by the timing run)
        for store in (root / "results").glob("*.jsonl"):
            store.unlink()
    interrupt(argv, home, sig, delay, what, python_exit=command == "train", after_line=after_line)
    complete(argv, home, what + ", rerun", after_line)


def test_a_slow_directory_abandoned_before_it_was_locked_is_removed(tmp_path):
    # a kill between making the directory and locking it (microseconds) leaves it under its
    # temporary name: removed once it is old enough that no maker can still be at work on it
    from autotm.tiers.slow_dirs import ABANDONED_NEW_SECONDS, remove_orphaned_dirs

    old, fresh = tmp_path / ".autotm-file-new-old", tmp_path / ".autotm-file-new-fresh"
    old.mkdir(mode=0o700)
    fresh.mkdir(mode=0o700)
    then = time.time() - 2 * ABANDONED_NEW_SECONDS
    os.utime(old, (then, then))
    assert remove_orphaned_dirs(str(tmp_path)) == [str(old)]
    assert sorted(os.listdir(tmp_path)) == [fresh.name]
