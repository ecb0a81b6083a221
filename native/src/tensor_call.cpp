// `cuvil._native.TensorCall`: one static-shape variant called with torch tensors in one native
// call. The Python fast path did the same in ~4.7 µs for a one-input model, most of it attribute
// lookups and interpreter frames; here the tensor's getters are called directly (fetched once,
// with the MRO resolved in Python by inspect.getattr_static), so no lookup happens per call.
// torch is not linked: everything goes through the tensor's Python-level API.
#include "tensor_call.h"

#include <pybind11/stl.h>

namespace cuvil {
namespace {

py::object steal(PyObject* p) {
    if (!p) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(p);
}

}  // namespace

TensorCall::TensorCall(std::shared_ptr<const Engine> engine, py::dict api, std::vector<InputSpec> inputs,
                       std::vector<OutputSpec> outputs, py::object miss, int result, py::object rebuild)
    : engine_(std::move(engine)), inputs_(std::move(inputs)), outputs_(std::move(outputs)),
      miss_(std::move(miss)), result_(static_cast<Result>(result)), rebuild_(std::move(rebuild)) {
    if (inputs_.size() != static_cast<size_t>(engine_->n_inputs()) ||
        outputs_.size() != static_cast<size_t>(engine_->n_outputs()))
        throw RunError("TensorCall: the engine takes " + std::to_string(engine_->n_inputs()) + " inputs and " +
                       std::to_string(engine_->n_outputs()) + " outputs; got specs for " +
                       std::to_string(inputs_.size()) + " and " + std::to_string(outputs_.size()));
    if (engine_->n_symbols() != 0) throw RunError("TensorCall: the program has dynamic sizes");
    if (result < 0 || result > 2) throw RunError("TensorCall: result must be 0, 1 or 2");
    auto get = [&](const char* name) { return py::object(api[name]); };
    tensor_type_ = get("type");
    dtype_ = get("dtype");
    shape_ = get("shape");
    is_cpu_ = get("is_cpu");
    layout_ = get("layout");
    strided_ = get("strided");
    is_contiguous_ = get("is_contiguous");
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

bool TensorCall::accepts(PyObject* x, const InputSpec& spec) const {
    if (Py_TYPE(x) != reinterpret_cast<PyTypeObject*>(tensor_type_.ptr())) return false;
    if (property(dtype_, x).ptr() != spec.dtype.ptr()) return false;
    py::object shape = property(shape_, x);
    if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != static_cast<Py_ssize_t>(spec.shape.size()))
        return false;
    for (size_t i = 0; i < spec.shape.size(); ++i) {
        long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
        if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
        if (n != spec.shape[i]) return false;
    }
    return property(is_cpu_, x).ptr() == Py_True && property(layout_, x).ptr() == strided_.ptr() &&
           method(is_contiguous_, x).ptr() == Py_True;
}

py::object TensorCall::allocate(const OutputSpec& spec) const {
    if (!spec.np_dtype.is_none()) {
        PyObject* args[] = {spec.shape.ptr(), spec.np_dtype.ptr()};
        py::object array = steal(PyObject_Vectorcall(np_empty_.ptr(), args, 2, nullptr));
        PyObject* arg = array.ptr();
        return steal(PyObject_Vectorcall(from_numpy_.ptr(), &arg, 1, nullptr));
    }
    py::dict kwargs;
    kwargs["dtype"] = spec.torch_dtype;
    return steal(PyObject_Call(torch_empty_.ptr(), py::make_tuple(spec.shape).ptr(), kwargs.ptr()));
}

py::object TensorCall::operator()(const py::tuple& args) const {
    if (args.size() != inputs_.size()) return miss_;
    std::vector<Buffer> in(inputs_.size()), out(outputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
        PyObject* x = PyTuple_GET_ITEM(args.ptr(), i);
        if (!accepts(x, inputs_[i])) return miss_;
        in[i] = Buffer{address(x), inputs_[i].nbytes};
    }
    py::tuple results(outputs_.size());
    for (size_t i = 0; i < outputs_.size(); ++i) {
        py::object t = allocate(outputs_[i]);
        out[i] = Buffer{address(t.ptr()), outputs_[i].nbytes};
        results[i] = std::move(t);
    }
    {
        py::gil_scoped_release nogil;
        engine_->run(in.data(), in.size(), out.data(), out.size(), nullptr, 0, nullptr);
    }
    switch (result_) {
    case Result::First: return results[0];
    case Result::Tuple: return std::move(results);
    case Result::Rebuild: break;
    }
    return rebuild_(py::list(results));
}

void bind_tensor_call(py::module_& m) {
    py::class_<InputSpec>(m, "TensorCallInput")
        .def(py::init([](py::object dtype, std::vector<int64_t> shape, uint64_t nbytes) {
                 return InputSpec{std::move(dtype), std::move(shape), nbytes};
             }),
             py::arg("dtype"), py::arg("shape"), py::arg("nbytes"));
    py::class_<OutputSpec>(m, "TensorCallOutput")
        .def(py::init([](py::tuple shape, py::object np_dtype, py::object torch_dtype, uint64_t nbytes) {
                 return OutputSpec{std::move(shape), std::move(np_dtype), std::move(torch_dtype), nbytes};
             }),
             py::arg("shape"), py::arg("np_dtype"), py::arg("torch_dtype"), py::arg("nbytes"));
    py::class_<TensorCall>(m, "TensorCall",
                           "A static-shape engine called with a tuple of torch tensors: checked, outputs "
                           "allocated and run in one native call (cuvil/compiled.py builds it).")
        .def(py::init<std::shared_ptr<const Engine>, py::dict, std::vector<InputSpec>, std::vector<OutputSpec>,
                      py::object, int, py::object>(),
             py::arg("engine"), py::arg("api"), py::arg("inputs"), py::arg("outputs"), py::arg("miss"),
             py::arg("result"), py::arg("rebuild"))
        .def("__call__", &TensorCall::operator(), py::arg("args"),
             "The outputs (as `result` says), or `miss` when an argument is not what the variant was "
             "compiled for (then nothing ran).");
}

}  // namespace cuvil
