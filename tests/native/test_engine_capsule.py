"""The engine exported to C through a PyCapsule, called from a C file built against the header."""
import ctypes
import subprocess
from pathlib import Path

import pytest
import torch
from engine_helpers import dag_reference, int_inputs

from cuvil import _native
from cuvil.runtime import include_dir

ctypes.pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
ctypes.pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]
ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

CALLER = r"""
#include <cuvil/engine_capi.h>
int call_engine(const cuvil_engine_api_v1 *api, const cuvil_buffer *in, const cuvil_buffer *out,
                const int64_t *symbols, char *err, size_t err_size) {
    if (api->abi_version != CUVIL_ENGINE_ABI_VERSION) return -2;
    return api->run(api->engine, in, out, symbols, err, err_size);
}
unsigned num_inputs(const cuvil_engine_api_v1 *api) { return api->num_inputs; }
"""


@pytest.fixture(scope="module")
def c_caller(tmp_path_factory):
    d = tmp_path_factory.mktemp("capi")
    (d / "caller.c").write_text(CALLER)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-I", include_dir(), "-o", str(d / "caller.so"),
                    str(d / "caller.c")], check=True)
    lib = ctypes.CDLL(str(d / "caller.so"))
    lib.call_engine.restype = ctypes.c_int
    lib.call_engine.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_char_p, ctypes.c_size_t]
    lib.num_inputs.argtypes = [ctypes.c_void_p]
    return lib


class Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("nbytes", ctypes.c_uint64)]


def buffers(tensors):
    return (Buffer * len(tensors))(*[Buffer(t.data_ptr(), t.nbytes) for t in tensors])


def test_capsule_has_the_documented_name(make_dag):
    cap = make_dag().capsule()
    assert _native.CAPSULE_NAME == "cuvil.engine"
    assert ctypes.pythonapi.PyCapsule_GetName(cap) == b"cuvil.engine"
    assert (Path(include_dir()) / "cuvil" / "engine_capi.h").read_text().count('"cuvil.engine"') == 1


def test_c_code_runs_the_engine_through_the_capsule(make_dag, weight, c_caller):
    exe = make_dag(1)
    cap = exe.capsule()
    del exe  # the capsule alone keeps the engine alive
    api = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"cuvil.engine")
    assert c_caller.num_inputs(api) == 2
    a, b = int_inputs(40, seed=9)
    outs = [torch.empty(40, 32), torch.empty(40, 64)]
    symbols = (ctypes.c_int64 * 1)(40)
    err = ctypes.create_string_buffer(256)
    assert c_caller.call_engine(api, buffers([a, b]), buffers(outs), symbols, err, 256) == 0
    ref = dag_reference(a, b, weight)
    assert torch.equal(outs[0], ref[0]) and torch.equal(outs[1], ref[1])

    symbols[0] = 41  # sizes no longer match: an error message, not a crash
    assert c_caller.call_engine(api, buffers([a, b]), buffers(outs), symbols, err, 256) == -1
    assert err.value.decode() == "input 0: expected 10496 bytes, got 10240"
