// `cuvil._native.StateSnapshot`: the model state a compiled variant baked in (weights, attributes,
// submodules, hooks), checked on every call, so that a change after the compile (an in-place
// weight update, `load_state_dict`, a rebound attribute, a new hook, `.train()`) is seen instead
// of answered with the old model. A dict is compared entry by entry by identity (insertion order
// included), a tensor by its version counter (every in-place op bumps it) and data pointer. In C++
// because BERT-small's ~500 dicts and 73 tensors take a few µs here and far longer as a Python loop.
// Before 3.12, a dict's version tag (PEP 509: it changes whenever the dict is written) skips the
// comparison of a dict not written since it last compared equal.
#include "state_snapshot.h"

#include <pybind11/stl.h>

#include <cstring>

namespace cuvil {
namespace {

// Values a rebinding may replace by an equal object (a notebook cell run again: `scale = 2.0`):
// exact floats by their bits (so -0.0 and 0.0 differ, a NaN equals itself), exact ints and strs by
// ==, and exact tuples, lists and dicts item by item. torch.export restores every module attribute
// after its trace from a pytree copy: a dict attribute (Hugging Face's `_tp_plan`) comes back as a
// new dict of the same items, which is no change.
bool same_value(PyObject* a, PyObject* b, int depth = 0) {
    if (a == b) return true;
    if (Py_TYPE(a) != Py_TYPE(b) || depth > 8) return false;
    if (PyFloat_CheckExact(a)) {
        double x = PyFloat_AS_DOUBLE(a), y = PyFloat_AS_DOUBLE(b);
        return std::memcmp(&x, &y, sizeof x) == 0;
    }
    if (PyLong_CheckExact(a) || PyUnicode_CheckExact(a)) return PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    if (PyTuple_CheckExact(a) || PyList_CheckExact(a)) {
        PyObject* fa = PySequence_Fast(a, "");     // a new reference to a itself, for tuples and lists
        PyObject* fb = PySequence_Fast(b, "");
        bool same = fa && fb && PySequence_Fast_GET_SIZE(fa) == PySequence_Fast_GET_SIZE(fb);
        for (Py_ssize_t i = 0; same && i < PySequence_Fast_GET_SIZE(fa); ++i)
            same = same_value(PySequence_Fast_GET_ITEM(fa, i), PySequence_Fast_GET_ITEM(fb, i), depth + 1);
        Py_XDECREF(fa);
        Py_XDECREF(fb);
        return same;
    }
    if (PyDict_CheckExact(a)) {
        if (PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b)) return false;
        Py_ssize_t pa = 0, pb = 0;
        PyObject *ka, *va, *kb, *vb;
        while (PyDict_Next(a, &pa, &ka, &va) && PyDict_Next(b, &pb, &kb, &vb))
            if (!same_value(ka, kb, depth + 1) || !same_value(va, vb, depth + 1)) return false;
        return true;
    }
    return false;
}

bool same_dict(PyObject* d, PyObject* items, bool whole) {
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (!whole) {
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyObject* item = PyList_GET_ITEM(items, i);
            PyObject* value = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(item, 0));
            if (!value && PyErr_Occurred()) throw py::error_already_set();
            if (!value || !same_value(PyTuple_GET_ITEM(item, 1), value)) return false;
        }
        return true;
    }
    if (PyDict_GET_SIZE(d) != n) return false;
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(d, &pos, &key, &value)) {
        PyObject* item = PyList_GET_ITEM(items, i++);
        if (PyTuple_GET_ITEM(item, 0) != key || !same_value(PyTuple_GET_ITEM(item, 1), value)) return false;
    }
    return true;
}

}  // namespace

StateSnapshot::StateSnapshot(py::list dicts, py::list items, std::vector<bool> whole, py::list tensors,
                             std::vector<bool> versioned, py::object version, py::object data_ptr)
    : whole_(std::move(whole)), versioned_(std::move(versioned)), version_(std::move(version)),
      data_ptr_(std::move(data_ptr)) {
    if (dicts.size() != items.size() || dicts.size() != whole_.size())
        throw py::value_error("StateSnapshot: one items list and one whole flag per dict");
    if (tensors.size() != versioned_.size()) throw py::value_error("StateSnapshot: one versioned flag per tensor");
    for (size_t i = 0; i < dicts.size(); ++i) {
        if (!PyDict_Check(dicts[i].ptr())) throw py::type_error("StateSnapshot: dicts must be dicts");
        if (!PyList_Check(items[i].ptr())) throw py::type_error("StateSnapshot: items must be lists");
        py::list pairs = items[i].cast<py::list>();
        for (auto pair : pairs)
            if (!PyTuple_Check(pair.ptr()) || PyTuple_GET_SIZE(pair.ptr()) != 2)
                throw py::type_error("StateSnapshot: items must be (key, value) tuples");
        dicts_.push_back(dicts[i]);
        items_.push_back(items[i]);
        tags_.push_back(0);     // compared on the first check
    }
    for (auto t : tensors) tensors_.push_back(t);
    for (size_t i = 0; i < tensors_.size(); ++i) marks_.push_back(mark(i));
}

std::pair<int64_t, int64_t> StateSnapshot::mark(size_t i) const {
    PyObject* tensor = tensors_[i].ptr();
    int64_t version = -1;
    if (versioned_[i]) {
        py::object v = py::reinterpret_steal<py::object>(Py_TYPE(version_.ptr())->tp_descr_get(
            version_.ptr(), tensor, reinterpret_cast<PyObject*>(Py_TYPE(tensor))));
        if (!v) throw py::error_already_set();
        version = v.cast<int64_t>();
    }
    py::object p = py::reinterpret_steal<py::object>(PyObject_Vectorcall(data_ptr_.ptr(), &tensor, 1, nullptr));
    if (!p) throw py::error_already_set();
    return {version, p.cast<int64_t>()};
}

uint64_t StateSnapshot::tag(size_t i) const {
#if PY_VERSION_HEX < 0x030C0000
    return reinterpret_cast<PyDictObject*>(dicts_[i].ptr())->ma_version_tag;
#else
    (void)i;
    return 0;  // no tag: every dict is compared
#endif
}

int64_t StateSnapshot::changed() const {
    for (size_t i = 0; i < dicts_.size(); ++i) {
        uint64_t now = tag(i);
        if (now != 0 && now == tags_[i]) continue;
        if (!same_dict(dicts_[i].ptr(), items_[i].ptr(), whole_[i])) return static_cast<int64_t>(i);
        tags_[i] = now;
    }
    for (size_t i = 0; i < tensors_.size(); ++i)
        if (mark(i) != marks_[i]) return static_cast<int64_t>(dicts_.size() + i);
    return -1;
}

void bind_state_snapshot(py::module_& m) {
    py::class_<StateSnapshot>(m, "StateSnapshot",
                              "The model state a compiled variant baked in, checked per call (cuvil/module_state.py builds it).")
        .def(py::init<py::list, py::list, std::vector<bool>, py::list, std::vector<bool>, py::object, py::object>(),
             py::arg("dicts"), py::arg("items"), py::arg("whole"), py::arg("tensors"), py::arg("versioned"), py::arg("version"), py::arg("data_ptr"))
        .def("changed", &StateSnapshot::changed,
             "-1 while nothing changed; else the index of the first changed dict, or len(dicts) + i for tensor i.");
}

}  // namespace cuvil
