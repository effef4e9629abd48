"""The command line: JSON output, one-line errors, --debug tracebacks."""

import json
import os
import subprocess
import sys

import pytest


def autotm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "autotm.cli", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_graph_json_has_the_documented_keys():
    r = autotm("graph", "vgg19", "--preset", "test", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in ("kernels", "tensors", "parameters", "peak_live_bytes", "capture_seconds"):
        assert key in s
    assert s["parameters"] == 143_667_240
    assert s["batch"] == 16 and s["kernels"] > 100 and s["peak_live_bytes"] > 0


def test_graph_table_mentions_peak_and_roles():
    r = autotm("graph", "resnet50", "--batch", "2", "--image", "32")
    assert r.returncode == 0, r.stderr
    assert "peak live bytes" in r.stdout and "weight" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("graph", "nosuchnet"), "unknown model 'nosuchnet'"),
        (("graph", "vgg19", "--preset", "huge"), "unknown preset 'huge'"),
        (("graph", "vgg19", "--image", "8", "--batch", "2"), "image size must be an int >= 32"),
    ],
)
def test_bad_input_is_one_clear_line(args, message):
    r = autotm(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback():
    r = autotm("--debug", "graph", "nosuchnet")
    assert r.returncode != 0
    assert "Traceback" in r.stderr


def test_plan_and_run_json_on_the_real_file_tier(tmp_path):
    cache = str(tmp_path / "profile.sqlite")
    plan_file = tmp_path / "plan.json"
    # at the smallest budget the planner fits on this CPU (its oneDNN's workspaces decide
    # whether 4:1 does: it did not on an AVX2-only EPYC), which moves tensors anywhere
    r = autotm("plan", "resnet50", "--memory", "cpu+file", "--budget", "min", "--formulation", "synchronous",
               "--time-limit", "20", "--cache", cache, "-o", str(plan_file), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in ("status", "predicted_seconds", "solve_seconds", "gap", "bytes_to_slow", "bytes_to_fast", "moves",
                "budget_bytes", "simulated"):
        assert key in s
    assert s["simulated"] is False and s["bytes_to_slow"] > 0 and s["peak_fast_bytes"] <= s["budget_bytes"]
    assert json.loads(plan_file.read_text())["version"] == 1
    minimum = s["budget_bytes"]
    r = autotm("run", "resnet50", "--memory", "cpu+file", "--budget", "min", "--formulation", "synchronous",
               "--time-limit", "20", "--cache", cache, "--iterations", "2", "--verify", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in ("measured_seconds", "predicted_seconds", "peak_fast_bytes", "budget_bytes", "identical"):
        assert key in s
    assert s["identical"] is True
    assert s["peak_fast_bytes"] <= s["budget_bytes"] == minimum
    # all-fast at that budget holds more: it says so, in the JSON and on stderr
    r = autotm("plan", "resnet50", "--memory", "cpu+file", "--budget", str(minimum), "--formulation", "all-fast",
               "--cache", cache, "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["fits_budget"] is False and s["arena_fits"] is False
    assert "warning: all-fast ignores the budget" in r.stderr and "x the budget of" in r.stderr

    # a cache filled while the machine ran 64x slower (its pace probe's record scaled so;
    # at 8x, a machine 6x busier now than when the cache was filled hid it): reusing it,
    # the CLI says so in one line, with the way out
    from autotm.profile.pace import PACE_VALUE
    import sqlite3

    with sqlite3.connect(cache) as db:
        assert db.execute("UPDATE vals SET value = value * 64 WHERE name = ?", (PACE_VALUE,)).rowcount == 1
    r = autotm("profile", "resnet50", "--memory", "cpu+file", "--cache", cache, "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["measured"] == 0 and row["pace_ratio"] > 1.5
    assert "warning: profile cache" in r.stderr and "slower than now" in r.stderr and "--recache" in r.stderr
    assert "Traceback" not in r.stderr and "PaceWarning" not in r.stderr


def test_plan_on_hypothetical_hardware_is_labelled_simulated(tmp_path):
    r = autotm("plan", "resnet50", "--preset", "test", "--memory", "sim:nvme", "--budget", "1:1",
               "--formulation", "synchronous", "--cache", str(tmp_path / "c.sqlite"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["simulated"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (("plan", "resnet50", "--formulation", "synchronous"), "a budget is needed"),
        (("plan", "resnet50", "--budget", "lots"), "not a budget"),
        (("run", "resnet50", "--memory", "sim:nvme", "--budget", "4:1"), "hypothetical hardware"),
        (("plan", "resnet50", "--memory", "floppy", "--budget", "4:1"), "unknown memory system"),
    ],
)
def test_plan_and_run_bad_input(args, message, tmp_path):
    # refused before the capture and the profile: nothing written to the (default) cache
    r = autotm(*args, env={**os.environ, "AUTOTM_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())


def test_a_budget_the_graph_alone_rules_out_fails_before_the_profile(tmp_path):
    """1 MB for resnet50 (its operands need more at one kernel): one line after the
    capture, naming the kernel and the lower bound, and no profile taken (no cache)."""
    cache = tmp_path / "never.sqlite"
    r = autotm("plan", "resnet50", "--memory", "cpu+file", "--budget", "1MB", "--formulation", "synchronous",
               "--cache", str(cache), "--json")
    assert r.returncode == 2
    assert "no synchronous plan fits a fast budget of 1,000,000 bytes: kernel " in r.stderr
    assert "before profiling" in r.stderr and "Traceback" not in r.stderr
    assert not cache.exists()
