"""Test-wide settings: on CI, hypothesis explores the same examples every run (no flaky reds)."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
