// What a compiled model took from the model it compiled, checked per call (see state_snapshot.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace cuvil {

// It holds no references to what it watches: its owner (cuvil.module_state.ModelState) keeps the
// dicts, item lists and tensors alive, where the garbage collector sees them. References held here
// it would not see: a model that holds its own compiled model would never be freed.
class StateSnapshot {
public:
    // dicts: the dicts to watch (modules' __dict__, _parameters, hooks, ...), items: a list of each
    // one's (key, value) pairs as they were, whole: per dict, whether those are all its entries (else
    // only those keys are watched: a function's globals); tensors: the tensors whose contents were
    // compiled in, versioned: per tensor, whether it has a version counter (an inference tensor has
    // none: only its address is watched), with the getset descriptor of torch.Tensor._version and
    // the data_ptr method.
    StateSnapshot(py::list dicts, py::list items, std::vector<bool> whole, py::list tensors,
                  std::vector<bool> versioned, py::object version, py::object data_ptr);

    // -1 while everything is as it was; else the index of the first dict that changed, or
    // len(dicts) + i for tensor i (modified in place, or its storage replaced).
    int64_t changed() const;

private:
    std::pair<int64_t, int64_t> mark(size_t i) const;
    uint64_t tag(size_t i) const;  // dict i's version tag, 0 where Python has none

    std::vector<py::handle> dicts_;
    std::vector<py::handle> items_;
    std::vector<bool> whole_;
    mutable std::vector<uint64_t> tags_;  // each dict's tag when it last compared equal
    std::vector<py::handle> tensors_;
    std::vector<bool> versioned_;
    std::vector<std::pair<int64_t, int64_t>> marks_;  // (version, data_ptr)
    py::object version_, data_ptr_;
};

void bind_state_snapshot(py::module_& m);

}  // namespace cuvil
