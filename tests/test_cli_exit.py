"""The command line's exit status through a real subprocess: 0 only on success, 1 for a
failed verification or demo, 2 for bad input, 130 for Ctrl-C, each with one line saying so."""

import signal
import subprocess
import sys
import textwrap
import time

# the CLI's main() in a child whose demo reports a mismatch with eager PyTorch (a real
# mismatch cannot be ordered; `run --verify` leaves through the same typer.Exit(1))
MISMATCH = textwrap.dedent("""
    import sys
    import autotm.demo
    from autotm.cli import main
    autotm.demo.run_demo = lambda *a, **k: False
    sys.argv = ["autotm", *sys.argv[1:]]
    main()
""")


def child(*args, code=MISMATCH):
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)


def test_failed_demo_exits_1_with_one_line():
    r = child("demo")
    assert r.returncode == 1, r.stderr
    assert "error: the demo failed" in r.stderr


def test_success_exits_0_and_bad_input_2():
    assert child("graph", "resnet50", "--batch", "2", "--image", "32", "--json").returncode == 0
    r = child("run", "resnet50", "--formulation", "all-fast", "--iterations", "0")
    assert r.returncode == 2 and "--iterations must be at least 1" in r.stderr


def test_ctrl_c_exits_130_with_one_line():
    p = subprocess.Popen([sys.executable, "-m", "autotm.cli", "graph", "densenet264", "--preset", "conventional"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # (capturing: importing torch and tracing take longer than this)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted (Ctrl-C)" in err
    assert "Traceback" not in err
