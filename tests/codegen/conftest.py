"""Fixtures of the codegen tests (helpers are in codegen_helpers.py)."""
import pytest


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path, monkeypatch):
    """Tests never write to the user's ~/.cache/cuvil."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cuvil-cache"))
