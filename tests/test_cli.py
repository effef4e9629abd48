"""The command line: JSON output, one-line errors, --debug tracebacks."""

import json
import subprocess
import sys

import pytest


def autotm(*args):
    return subprocess.run([sys.executable, "-m", "autotm.cli", *args], capture_output=True, text=True, timeout=300)


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
