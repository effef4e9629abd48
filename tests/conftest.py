"""Test-wide settings.

- On CI, hypothesis explores the same examples every run (no flaky reds).
- Every profile a test takes without naming its cache (the CLI's, `autotm.profile`'s
  default) goes to a cache of this test session, never the user's: a test run on a loaded
  machine must not leave timings that the user's next `autotm run` trusts. Subprocesses
  inherit it through the environment.
"""

import os
import shutil
import tempfile

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_configure(config):
    config._autotm_cache_dir = tempfile.mkdtemp(prefix="autotm-test-cache-")
    config._autotm_cache_before = os.environ.get("AUTOTM_CACHE_DIR")
    os.environ["AUTOTM_CACHE_DIR"] = config._autotm_cache_dir


def pytest_unconfigure(config):
    d = getattr(config, "_autotm_cache_dir", None)
    if d is None:
        return
    before = config._autotm_cache_before
    if before is None:
        os.environ.pop("AUTOTM_CACHE_DIR", None)
    else:
        os.environ["AUTOTM_CACHE_DIR"] = before
    shutil.rmtree(d, ignore_errors=True)
