// `cuvil._native.TensorCall`: a compiled variant called with torch tensors in one native call:
// the guard's checks, the symbols bound from the input shapes, the outputs allocated at the sizes
// they give, the engine run. The Python fast path did the same in ~4.7 µs for a one-input static
// model, most of it attribute lookups and interpreter frames; here the tensor's getters are called
// directly (fetched once, with the MRO resolved in Python by inspect.getattr_static), so no lookup
// happens per call. torch is not linked: everything goes through the tensor's Python-level API.
#include "tensor_call.h"

#include <pybind11/stl.h>

namespace cuvil {
namespace {

py::object steal(PyObject* p) {
    if (!p) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(p);
}

// Whether the n integers at `data` lie in spec.values (the Python path names the one that does not).
bool in_range(const void* data, int64_t n, const InputSpec& spec) {
    auto [lo, hi] = *spec.values;
    auto check = [&](const auto* v) {
        bool ok = true;
        for (int64_t i = 0; i < n; ++i) ok &= (v[i] >= lo) & (v[i] <= hi);   // no branch: vectorises
        return ok;
    };
    return spec.itemsize == 8 ? check(static_cast<const int64_t*>(data)) : check(static_cast<const int32_t*>(data));
}

InputSpec read_input(py::handle h, size_t i, int n_symbols) {
    std::string where = "TensorCall input " + std::to_string(i);
    auto t = h.cast<py::tuple>();
    if (t.size() != 7) throw RunError(where + ": expected (dtype, rank, fixed, bound, derived, itemsize, values)");
    InputSpec spec{py::reinterpret_borrow<py::object>(t[0]), t[1].cast<size_t>(), {}, {}, {}, t[5].cast<uint64_t>(), {}};
    if (!t[6].is_none()) {
        spec.values = t[6].cast<std::pair<int64_t, int64_t>>();
        if (spec.itemsize != 8 && spec.itemsize != 4) throw RunError(where + ": checked values must be i64 or i32");
    }
    for (auto [axis, size] : t[2].cast<std::vector<std::pair<size_t, int64_t>>>()) spec.fixed.emplace_back(axis, size);
    for (auto [axis, symbol] : t[3].cast<std::vector<std::pair<size_t, int>>>()) {
        if (symbol < 0 || symbol >= n_symbols) throw RunError(where + ": symbol " + std::to_string(symbol) + " out of range");
        spec.bound.emplace_back(axis, symbol);
    }
    for (auto item : t[4].cast<py::sequence>()) {
        auto pair = item.cast<py::tuple>();
        spec.derived.emplace_back(pair[0].cast<size_t>(), read_expr(pair[1], where + " derived", n_symbols));
    }
    for (auto& [axis, _] : spec.fixed)
        if (axis >= spec.rank) throw RunError(where + ": axis out of range");
    for (auto& [axis, _] : spec.bound)
        if (axis >= spec.rank) throw RunError(where + ": axis out of range");
    for (auto& [axis, _] : spec.derived)
        if (axis >= spec.rank) throw RunError(where + ": axis out of range");
    return spec;
}

OutputSpec read_output(py::handle h, size_t i, int n_symbols) {
    std::string where = "TensorCall output " + std::to_string(i);
    auto t = h.cast<py::tuple>();
    if (t.size() != 4) throw RunError(where + ": expected (shape, numpy dtype, torch dtype, itemsize)");
    OutputSpec spec{{}, py::reinterpret_borrow<py::object>(t[1]), py::reinterpret_borrow<py::object>(t[2]),
                    t[3].cast<uint64_t>()};
    for (auto d : t[0].cast<py::sequence>()) spec.shape.push_back(read_expr(d, where + " shape", n_symbols));
    return spec;
}

}  // namespace

TensorCall::TensorCall(std::shared_ptr<const Engine> engine, py::dict api, py::sequence inputs, py::sequence outputs,
                       std::vector<std::pair<int64_t, int64_t>> ranges, py::object miss, int result, py::object rebuild)
    : engine_(std::move(engine)), ranges_(std::move(ranges)), miss_(std::move(miss)),
      result_(static_cast<Result>(result)), rebuild_(std::move(rebuild)) {
    int n_symbols = static_cast<int>(ranges_.size());
    for (size_t i = 0; i < inputs.size(); ++i) inputs_.push_back(read_input(inputs[i], i, n_symbols));
    for (size_t i = 0; i < outputs.size(); ++i) outputs_.push_back(read_output(outputs[i], i, n_symbols));
    if (inputs_.size() != static_cast<size_t>(engine_->n_inputs()) ||
        outputs_.size() != static_cast<size_t>(engine_->n_outputs()) || n_symbols != engine_->n_symbols())
        throw RunError("TensorCall: the engine takes " + std::to_string(engine_->n_inputs()) + " inputs, " +
                       std::to_string(engine_->n_outputs()) + " outputs and " + std::to_string(engine_->n_symbols()) +
                       " symbols; got specs for " + std::to_string(inputs_.size()) + ", " +
                       std::to_string(outputs_.size()) + " and " + std::to_string(n_symbols));
    if (result < 0 || result > 2) throw RunError("TensorCall: result must be 0, 1 or 2");
    auto get = [&](const char* name) { return py::object(api[name]); };
    tensor_type_ = get("type");
    dtype_ = get("dtype");
    shape_ = get("shape");
    is_cpu_ = get("is_cpu");
    layout_ = get("layout");
    strided_ = get("strided");
    is_contiguous_ = get("is_contiguous");
    is_neg_ = get("is_neg");
    data_ptr_ = get("data_ptr");
    np_empty_ = get("np_empty");
    from_numpy_ = get("from_numpy");
    torch_empty_ = get("torch_empty");
}

py::object TensorCall::property(const py::object& descr, PyObject* x) const {
    return steal(Py_TYPE(descr.ptr())->tp_descr_get(descr.ptr(), x, reinterpret_cast<PyObject*>(Py_TYPE(x))));
}

py::object TensorCall::method(const py::object& descr, PyObject* x) const {
    return steal(PyObject_Vectorcall(descr.ptr(), &x, 1, nullptr));
}

void* TensorCall::address(PyObject* x) const {
    py::object p = method(data_ptr_, x);
    void* out = PyLong_AsVoidPtr(p.ptr());
    if (!out && PyErr_Occurred()) throw py::error_already_set();
    return out;
}

int64_t TensorCall::accepts(PyObject* x, const InputSpec& spec, std::vector<int64_t>& values,
                            std::vector<py::object>& shapes) const {
    if (Py_TYPE(x) != reinterpret_cast<PyTypeObject*>(tensor_type_.ptr())) return -1;
    if (property(dtype_, x).ptr() != spec.dtype.ptr()) return -1;
    py::object shape = property(shape_, x);
    if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != static_cast<Py_ssize_t>(spec.rank)) return -1;
    auto dim = [&](size_t axis) {
        long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), axis));
        if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
        return static_cast<int64_t>(n);
    };
    for (auto& [axis, size] : spec.fixed)
        if (dim(axis) != size) return -1;
    for (auto& [axis, symbol] : spec.bound) {
        int64_t n = dim(axis);
        if (values[symbol] < 0) values[symbol] = n;
        else if (values[symbol] != n) return -1;
    }
    // a tensor with torch's lazy negation bit (a complex conjugate's imaginary part) holds the
    // values negated in memory: the slow path resolves it
    if (property(is_cpu_, x).ptr() != Py_True || property(layout_, x).ptr() != strided_.ptr() ||
        method(is_contiguous_, x).ptr() != Py_True || method(is_neg_, x).ptr() != Py_False)
        return -1;
    int64_t nbytes = static_cast<int64_t>(spec.itemsize);
    for (size_t axis = 0; axis < spec.rank; ++axis) nbytes *= dim(axis);
    if (spec.values && !in_range(address(x), nbytes / static_cast<int64_t>(spec.itemsize), spec)) return -1;
    shapes.push_back(std::move(shape));
    return nbytes;
}

py::object TensorCall::allocate(const OutputSpec& spec, const std::vector<int64_t>& values, uint64_t& nbytes) const {
    py::tuple shape(spec.shape.size());
    nbytes = spec.itemsize;
    for (size_t i = 0; i < spec.shape.size(); ++i) {
        int64_t n = spec.shape[i].eval(values.data());
        if (n < 0) throw RunError("an output dim evaluates to " + std::to_string(n));
        nbytes *= static_cast<uint64_t>(n);
        shape[i] = py::int_(n);
    }
    if (!spec.np_dtype.is_none()) {
        PyObject* args[] = {shape.ptr(), spec.np_dtype.ptr()};
        py::object array = steal(PyObject_Vectorcall(np_empty_.ptr(), args, 2, nullptr));
        PyObject* arg = array.ptr();
        return steal(PyObject_Vectorcall(from_numpy_.ptr(), &arg, 1, nullptr));
    }
    py::dict kwargs;
    kwargs["dtype"] = spec.torch_dtype;
    return steal(PyObject_Call(torch_empty_.ptr(), py::make_tuple(shape).ptr(), kwargs.ptr()));
}

py::object TensorCall::operator()(const py::tuple& args) const {
    if (args.size() != inputs_.size()) return miss_;
    std::vector<int64_t> values(ranges_.size(), -1);
    std::vector<py::object> shapes;
    std::vector<Buffer> in(inputs_.size()), out(outputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
        PyObject* x = PyTuple_GET_ITEM(args.ptr(), i);
        int64_t nbytes = accepts(x, inputs_[i], values, shapes);
        if (nbytes < 0) return miss_;
        in[i] = Buffer{address(x), static_cast<uint64_t>(nbytes)};
    }
    for (size_t s = 0; s < ranges_.size(); ++s)
        if (values[s] < ranges_[s].first || values[s] > ranges_[s].second) return miss_;
    for (size_t i = 0; i < inputs_.size(); ++i)
        for (auto& [axis, size] : inputs_[i].derived) {
            int64_t want;
            try {
                want = size.eval(values.data());
            } catch (const EvalError&) {
                return miss_;
            }
            if (PyLong_AsLongLong(PyTuple_GET_ITEM(shapes[i].ptr(), axis)) != want) return miss_;
        }
    py::tuple results(outputs_.size());
    for (size_t i = 0; i < outputs_.size(); ++i) {
        uint64_t nbytes = 0;
        py::object t = allocate(outputs_[i], values, nbytes);
        out[i] = Buffer{address(t.ptr()), nbytes};
        results[i] = std::move(t);
    }
    {
        py::gil_scoped_release nogil;
        engine_->run(in.data(), in.size(), out.data(), out.size(), values.data(), values.size(), nullptr);
    }
    switch (result_) {
    case Result::First: return results[0];
    case Result::Tuple: return std::move(results);
    case Result::Rebuild: break;
    }
    return rebuild_(py::list(results));
}

void bind_tensor_call(py::module_& m) {
    py::class_<TensorCall>(m, "TensorCall",
                           "An engine called with a tuple of torch tensors: checked against the variant's guard, "
                           "symbols bound, outputs allocated and run in one native call (cuvil/compiled.py builds it).")
        .def(py::init<std::shared_ptr<const Engine>, py::dict, py::sequence, py::sequence,
                      std::vector<std::pair<int64_t, int64_t>>, py::object, int, py::object>(),
             py::arg("engine"), py::arg("api"), py::arg("inputs"), py::arg("outputs"), py::arg("ranges"),
             py::arg("miss"), py::arg("result"), py::arg("rebuild"))
        .def("__call__", &TensorCall::operator(), py::arg("args"),
             "The outputs (as `result` says), or `miss` when an argument is not what the variant was "
             "compiled for (then nothing ran).");
}

}  // namespace cuvil
