import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from native_jit import jit  # noqa: E402

from cuvil.runtime import Executable, get_num_threads, set_num_threads  # noqa: E402
from engine_helpers import K, N, dag_program  # noqa: E402


@pytest.fixture
def pool_threads():
    """Sets the pool size for one test, then restores it."""
    before = get_num_threads()
    yield set_num_threads
    set_num_threads(before)


@pytest.fixture(scope="session")
def jitted():
    """(JitCode, JitModule) with every test kernel; kept alive for the whole session."""
    return jit()


@pytest.fixture
def weight():
    g = torch.Generator().manual_seed(7)
    return torch.randint(-3, 4, (K, N), generator=g).float()


@pytest.fixture
def make_dag(jitted, weight):
    """Executable of the DAG program; min_chunk_ns=1 splits every splittable step."""
    def make(min_chunk_ns=None):
        return Executable(dag_program(weight), jitted[1], min_chunk_ns=min_chunk_ns)
    return make
