"""Shared fixtures: the location of ../shared (tests that need it skip cleanly without it)."""

import os
from pathlib import Path

import pytest

# ../shared next to the checkout; PRECISION_DOCTOR_SHARED overrides it (e.g. from a git worktree).
SHARED = Path(os.environ.get("PRECISION_DOCTOR_SHARED")
              or Path(__file__).resolve().parents[1].parent / "shared")


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present")
    return SHARED
