// A static-shape engine called with torch tensors in one native call (see tensor_call.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "engine.h"

namespace py = pybind11;

namespace cuvil {

struct InputSpec {
    py::object dtype;            // the torch.dtype, compared by identity
    std::vector<int64_t> shape;
    uint64_t nbytes;
};

struct OutputSpec {
    py::tuple shape;
    py::object np_dtype;         // None: numpy lacks the dtype, allocate with torch.empty
    py::object torch_dtype;
    uint64_t nbytes;
};

class TensorCall {
public:
    enum class Result { First = 0, Tuple = 1, Rebuild = 2 };  // the one output, a tuple, rebuild(list)

    // api: "type" (torch.Tensor), the getters "dtype", "shape", "is_cpu", "layout" and methods
    // "is_contiguous", "data_ptr" as inspect.getattr_static finds them on torch.Tensor, "strided",
    // and the allocators "np_empty", "from_numpy", "torch_empty".
    TensorCall(std::shared_ptr<const Engine> engine, py::dict api, std::vector<InputSpec> inputs,
               std::vector<OutputSpec> outputs, py::object miss, int result, py::object rebuild);

    py::object operator()(const py::tuple& args) const;

private:
    py::object property(const py::object& descr, PyObject* x) const;
    py::object method(const py::object& descr, PyObject* x) const;
    void* address(PyObject* x) const;
    bool accepts(PyObject* x, const InputSpec& spec) const;
    py::object allocate(const OutputSpec& spec) const;

    std::shared_ptr<const Engine> engine_;
    std::vector<InputSpec> inputs_;
    std::vector<OutputSpec> outputs_;
    py::object miss_;
    Result result_;
    py::object rebuild_;
    py::object tensor_type_, dtype_, shape_, is_cpu_, layout_, strided_, is_contiguous_, data_ptr_;
    py::object np_empty_, from_numpy_, torch_empty_;
};

void bind_tensor_call(py::module_& m);

}  // namespace cuvil
