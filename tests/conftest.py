"""Shared fixtures for zfeed's Python suites.

The seed of the randomized suites comes from ZFEED_TEST_SEED (random when unset). It is fixed once
per run in pytest_configure, printed in the terminal summary of every run (also under -q) and by the
`seed` fixture (pytest shows that output beside any failing test), and it prefixes the ids of the
randomized cases, so `ZFEED_TEST_SEED=<seed> pytest tests/test_peers.py` replays a failure.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def _seed_from_env() -> int:
    text = os.environ.get("ZFEED_TEST_SEED", "").strip()
    if text:
        try:
            return int(text, 0)
        except ValueError:
            raise pytest.UsageError(f"ZFEED_TEST_SEED must be an integer, got {text!r}") from None
    return random.SystemRandom().randrange(1, 2**31)


def pytest_configure(config):
    config.zfeed_seed = _seed_from_env()


def pytest_report_header(config):
    return f"zfeed test seed: {config.zfeed_seed} (replay with ZFEED_TEST_SEED={config.zfeed_seed})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(
        f"zfeed test seed: {config.zfeed_seed} (replay with ZFEED_TEST_SEED={config.zfeed_seed})"
    )


@pytest.fixture
def seed(request) -> int:
    """The run's seed; printed so that it shows in the captured output of a failing test."""
    value = request.config.zfeed_seed
    print(f"zfeed test seed: {value} (replay with ZFEED_TEST_SEED={value})")
    return value


@pytest.fixture(scope="session")
def shared() -> Path:
    """The shared data beside the project root (../shared); tests that need it skip without it."""
    if not SHARED.is_dir():
        pytest.skip(f"the shared data is absent ({SHARED} not found; it exists on the project machines, not outside CI)")
    return SHARED

