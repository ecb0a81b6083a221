"""Fixtures of the OpInfo tests."""
import pytest


@pytest.fixture(autouse=True)
def _object_cache_dir(request, monkeypatch, tmp_path_factory):
    """Compiled kernels go to pytest's cache folder (reused from run to run; a temporary one when the
    cache plugin is off), never to the user's ~/.cache/cuvil."""
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("cuvil-objects") if cache is not None else tmp_path_factory.mktemp("cuvil-objects")
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(folder))
