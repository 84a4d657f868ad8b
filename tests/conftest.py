import pytest; from pathlib import Path
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
@pytest.fixture
def shared_dir():
    if not SHARED.is_dir(): pytest.skip("../shared is not present")
    return SHARED
