// A compiled variant called with torch tensors in one native call (see tensor_call.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "engine.h"

namespace py = pybind11;

namespace cuvil {

// What an input must be: its dtype (compared by identity), rank, fixed sizes, the dims that bind
// symbols (the first binds, later ones must agree) and the dims that are expressions of them.
struct InputSpec {
    py::object dtype;
    size_t rank;
    std::vector<std::pair<size_t, int64_t>> fixed;  // (axis, size)
    std::vector<std::pair<size_t, int>> bound;      // (axis, symbol)
    std::vector<std::pair<size_t, Expr>> derived;   // (axis, size)
    uint64_t itemsize;
    std::optional<std::pair<int64_t, int64_t>> values;  // an index input: the (lo, hi) its values must lie in
};

struct OutputSpec {
    std::vector<Expr> shape;
    py::object np_dtype;  // None: numpy lacks the dtype, allocate with torch.empty
    py::object torch_dtype;
    uint64_t itemsize;
};

class TensorCall {
public:
    enum class Result { First = 0, Tuple = 1, Rebuild = 2 };  // the one output, a tuple, rebuild(list)

    // api: "type" (torch.Tensor), the getters "dtype", "shape", "is_cpu", "layout" and methods
    // "is_contiguous", "is_neg", "data_ptr" as inspect.getattr_static finds them on torch.Tensor, "strided",
    // and the allocators "np_empty", "from_numpy", "torch_empty".
    // inputs: (dtype, rank, [(axis, size)], [(axis, symbol)], [(axis, postfix)], itemsize, (lo, hi) or None)
    // each, the last for an index input whose values are checked (a call with one outside is a miss);
    // outputs: ([postfix per dim], numpy dtype or None, torch dtype, itemsize) each; ranges: the
    // symbols' inclusive (lo, hi).
    TensorCall(std::shared_ptr<const Engine> engine, py::dict api, py::sequence inputs, py::sequence outputs,
               std::vector<std::pair<int64_t, int64_t>> ranges, py::object miss, int result, py::object rebuild);

    py::object operator()(const py::tuple& args) const;

private:
    py::object property(const py::object& descr, PyObject* x) const;
    py::object method(const py::object& descr, PyObject* x) const;
    void* address(PyObject* x) const;
    // Checks x against the spec, binding symbols into `values`; its byte size, or -1 to refuse.
    int64_t accepts(PyObject* x, const InputSpec& spec, std::vector<int64_t>& values,
                    std::vector<py::object>& shapes) const;
    py::object allocate(const OutputSpec& spec, const std::vector<int64_t>& values, uint64_t& nbytes) const;

    std::shared_ptr<const Engine> engine_;
    std::vector<InputSpec> inputs_;
    std::vector<OutputSpec> outputs_;
    std::vector<std::pair<int64_t, int64_t>> ranges_;
    py::object miss_;
    Result result_;
    py::object rebuild_;
    py::object tensor_type_, dtype_, shape_, is_cpu_, layout_, strided_, is_contiguous_, is_neg_, data_ptr_;
    py::object np_empty_, from_numpy_, torch_empty_;
};

void bind_tensor_call(py::module_& m);

// A size expression from the program format: an int or a postfix token list (bindings.cpp).
Expr read_expr(py::handle h, const std::string& where, int n_symbols);

}  // namespace cuvil
