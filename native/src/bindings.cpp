// pybind11 module `cuvil._native`: builds engines from plain-data programs and runs them.
// The program format is documented in cuvil/runtime/engine.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <set>

#include "cuvil/engine_capi.h"
#include "engine.h"
#include "pool.h"
#include "select.h"
#include "state_snapshot.h"
#include "tensor_call.h"

namespace py = pybind11;
using namespace cuvil;

namespace {

std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

// ---- reading the program description ---------------------------------------------------------
[[noreturn]] void bad(const std::string& where, const std::string& what) {
    throw ProgramError("invalid program: " + where + ": " + what);
}

int64_t to_int(py::handle h, const std::string& where) {
    if (!py::isinstance<py::int_>(h) || py::isinstance<py::bool_>(h))
        bad(where, "expected an int, got " + type_name(h));
    try {
        return h.cast<int64_t>();
    } catch (const py::cast_error&) {
        bad(where, "the int does not fit in 64 bits");
    }
}

int to_index(py::handle h, const std::string& where) {
    int64_t v = to_int(h, where);
    if (v < INT32_MIN || v > INT32_MAX) bad(where, "index " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
}

py::list to_list(py::handle h, const std::string& where) {
    if (!py::isinstance<py::list>(h) && !py::isinstance<py::tuple>(h))
        bad(where, "expected a list, got " + type_name(h));
    return py::list(py::reinterpret_borrow<py::object>(h));
}

std::vector<int> to_indices(py::handle h, const std::string& where) {
    std::vector<int> out;
    py::list items = to_list(h, where);
    for (size_t i = 0; i < items.size(); ++i) out.push_back(to_index(items[i], where + "[" + std::to_string(i) + "]"));
    return out;
}

// An int, or a postfix token list: ints, "$N" (symbol N), "+", "-", "*", "//", "%", "max", "min".
Expr to_expr(py::handle h, const std::string& where, int n_symbols) {
    if (py::isinstance<py::int_>(h) && !py::isinstance<py::bool_>(h)) return Expr::constant(to_int(h, where));
    static const std::pair<const char*, Expr::Op> ops[] = {
        {"+", Expr::Op::Add},      {"-", Expr::Op::Sub},  {"*", Expr::Op::Mul}, {"//", Expr::Op::FloorDiv},
        {"%", Expr::Op::Mod},      {"max", Expr::Op::Max}, {"min", Expr::Op::Min}};
    if (!py::isinstance<py::list>(h) && !py::isinstance<py::tuple>(h))
        bad(where, "expected an int or a postfix token list, got " + type_name(h));
    std::vector<Expr::Token> code;
    py::list items = to_list(h, where);
    for (size_t i = 0; i < items.size(); ++i) {
        std::string at = where + "[" + std::to_string(i) + "]";
        py::handle t = items[i];
        if (!py::isinstance<py::str>(t)) {
            code.push_back({Expr::Op::Const, to_int(t, at)});
            continue;
        }
        std::string s = t.cast<std::string>();
        bool found = false;
        for (auto& [name, op] : ops)
            if (s == name) {
                code.push_back({op, 0});
                found = true;
            }
        if (found) continue;
        if (s.size() < 2 || s[0] != '$' || s.find_first_not_of("0123456789", 1) != std::string::npos || s.size() > 10)
            bad(at, "unknown token '" + s + "'");
        code.push_back({Expr::Op::Sym, std::stoll(s.substr(1))});
    }
    Expr e;
    std::string err = Expr::build(std::move(code), n_symbols, e);
    if (!err.empty()) bad(where, err);
    return e;
}

// A dict read key by key; done() refuses keys nobody asked for (typos).
class Fields {
public:
    Fields(py::handle h, std::string path) : path_(std::move(path)) {
        if (!py::isinstance<py::dict>(h)) bad(path_, "expected a dict, got " + type_name(h));
        dict_ = py::reinterpret_borrow<py::dict>(h);
    }
    py::handle required(const char* key) {
        py::handle v = optional(key);
        if (!v) bad(path_, std::string("missing '") + key + "'");
        return v;
    }
    py::handle optional(const char* key) {
        used_.insert(key);
        if (!dict_.contains(key) || dict_[key].is_none()) return py::handle();
        return dict_[py::str(key)];
    }
    std::string at(const char* key) const { return path_ + "." + key; }
    void done() const {
        for (auto item : dict_) {
            std::string k = py::str(item.first);
            if (!used_.count(k)) bad(path_, "unknown key '" + k + "'");
        }
    }

private:
    py::dict dict_;
    std::string path_;
    std::set<std::string> used_;
};

// ---- DLPack ------------------------------------------------------------------------------------
// A consumed DLPack tensor: its bytes, and ownership that calls the producer's deleter.
struct DlView {
    void* data = nullptr;
    uint64_t nbytes = 0;
    dl::DataType dtype{};
    bool read_only = false;
    std::shared_ptr<void> owner;
};

std::string dtype_str(const dl::DataType& t) {
    for (const char* n : {"f32", "f16", "bf16", "i64", "i32", "i8", "i1"}) {
        DType d = *dtype_from_name(n);
        if (d.code == t.code && d.bits == t.bits && t.lanes == 1) return d.name;
    }
    static const char* kinds[] = {"i", "u", "f", "ptr", "bf", "c", "bool"};
    std::string kind = t.code < 7 ? kinds[t.code] : "code" + std::to_string(t.code) + "_";
    return kind + std::to_string(t.bits) + (t.lanes == 1 ? "" : "x" + std::to_string(t.lanes));
}

template <class Managed>
std::shared_ptr<void> own(Managed* m) {
    return std::shared_ptr<void>(m, [](void* p) {
        auto* mt = static_cast<Managed*>(p);
        if (mt->deleter) {
            py::gil_scoped_acquire gil;  // a producer may release Python objects
            mt->deleter(mt);
        }
    });
}

template <class E>
DlView take_dlpack(py::handle obj, const std::string& what) {
    if (!py::hasattr(obj, "__dlpack__"))
        throw E(what + ": expected a tensor or array with __dlpack__" +
                (std::is_same_v<E, RunError> ? " or an (address, nbytes) pair" : "") + ", got " + type_name(obj));
    py::object cap;
    try {
        try {
            cap = obj.attr("__dlpack__")(py::arg("max_version") = py::make_tuple(1, 0));
        } catch (py::error_already_set& err) {
            if (!err.matches(PyExc_TypeError)) throw;
            cap = obj.attr("__dlpack__")();  // a producer older than DLPack 1.0
        }
    } catch (py::error_already_set& err) {
        throw E(what + ": cannot take a DLPack view: " + std::string(err.what()));
    }
    DlView v;
    const dl::Tensor* t = nullptr;
    PyObject* c = cap.ptr();
    if (PyCapsule_IsValid(c, "dltensor_versioned")) {
        auto* m = static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
        PyCapsule_SetName(c, "used_dltensor_versioned");
        v.owner = own(m);
        if (m->version.major != 1) throw E(what + ": unsupported DLPack version " + std::to_string(m->version.major));
        v.read_only = m->flags & dl::kFlagReadOnly;
        t = &m->dl_tensor;
    } else if (PyCapsule_IsValid(c, "dltensor")) {
        auto* m = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
        PyCapsule_SetName(c, "used_dltensor");
        v.owner = own(m);
        t = &m->dl_tensor;
    } else {
        throw E(what + ": __dlpack__ did not return a DLPack capsule");
    }
    if (t->device.device_type != dl::kCPU && t->device.device_type != dl::kCPUPinned)
        throw E(what + ": the tensor is not in CPU memory (DLPack device type " +
                std::to_string(t->device.device_type) + ")");
    if (t->dtype.lanes != 1 || t->dtype.bits % 8 != 0)
        throw E(what + ": unsupported element type " + dtype_str(t->dtype));
    uint64_t numel = 1;
    int64_t expect_stride = 1;
    bool contiguous = true;
    for (int i = t->ndim - 1; i >= 0; --i) {
        if (t->strides && t->shape[i] != 1 && t->strides[i] != expect_stride) contiguous = false;
        expect_stride *= t->shape[i];
        numel *= static_cast<uint64_t>(t->shape[i]);
    }
    if (!contiguous && numel != 0) throw E(what + ": the tensor is not contiguous");  // empty: any strides
    v.data = static_cast<char*>(t->data) + t->byte_offset;
    v.nbytes = numel * (t->dtype.bits / 8);
    v.dtype = t->dtype;
    return v;
}

template <class E>
void check_dtype(const DlView& v, const DType& want, const std::string& what) {
    if (v.dtype.code != want.code || v.dtype.bits != want.bits)
        throw E(what + ": expected dtype " + want.name + ", got " + dtype_str(v.dtype));
}

DType to_dtype(py::handle h, const std::string& where) {
    if (!py::isinstance<py::str>(h)) bad(where, "expected a dtype name, got " + type_name(h));
    std::string name = h.cast<std::string>();
    auto d = dtype_from_name(name);
    if (!d) bad(where, "unknown dtype '" + name + "' (known: f32, f16, bf16, i64, i32, i8, i1)");
    return *d;
}

// ---- program ------------------------------------------------------------------------------------
SlotDesc read_slot(py::handle h, const std::string& path, int n_symbols) {
    Fields f(h, path);
    py::handle kind_h = f.required("kind");
    std::string kind = py::isinstance<py::str>(kind_h) ? kind_h.cast<std::string>() : "";
    SlotDesc s;
    if (kind == "input" || kind == "output") {
        s.kind = kind == "input" ? SlotKind::Input : SlotKind::Output;
        s.index = to_index(f.required("index"), f.at("index"));
        s.bytes = to_expr(f.required("bytes"), f.at("bytes"), n_symbols);
        s.dtype = to_dtype(f.required("dtype"), f.at("dtype"));
    } else if (kind == "arena") {
        s.kind = SlotKind::Arena;
        s.offset = to_expr(f.required("offset"), f.at("offset"), n_symbols);
        s.bytes = to_expr(f.required("bytes"), f.at("bytes"), n_symbols);
    } else if (kind == "const") {
        s.kind = SlotKind::Const;
        s.dtype = to_dtype(f.required("dtype"), f.at("dtype"));
        DlView v = take_dlpack<ProgramError>(f.required("data"), "invalid program: " + f.at("data"));
        check_dtype<ProgramError>(v, s.dtype, "invalid program: " + f.at("data"));
        s.data = v.data;
        s.data_bytes = v.nbytes;
        s.keepalive = std::move(v.owner);
    } else if (kind == "status") {
        s.kind = SlotKind::Status;
        py::list errors = to_list(f.required("errors"), f.at("errors"));
        for (size_t i = 0; i < errors.size(); ++i) {
            if (!py::isinstance<py::str>(errors[i])) bad(f.at("errors") + "[" + std::to_string(i) + "]", "expected a str");
            s.errors.push_back(errors[i].cast<std::string>());
        }
    } else {
        bad(f.at("kind"), "expected 'input', 'output', 'arena', 'const' or 'status'");
    }
    f.done();
    return s;
}

StepDesc read_step(py::handle h, const std::string& path, int n_symbols) {
    Fields f(h, path);
    StepDesc s;
    int64_t kernel = to_int(f.required("kernel"), f.at("kernel"));
    s.kernel = static_cast<uintptr_t>(kernel);
    s.slots = to_indices(f.required("slots"), f.at("slots"));
    py::list dims = to_list(f.required("dims"), f.at("dims"));
    for (size_t i = 0; i < dims.size(); ++i)
        s.dims.push_back(to_expr(dims[i], f.at("dims") + "[" + std::to_string(i) + "]", n_symbols));
    if (py::handle d = f.optional("deps")) s.deps = to_indices(d, f.at("deps"));
    if (py::handle p = f.optional("priority")) s.priority = to_int(p, f.at("priority"));
    if (py::handle sp = f.optional("split")) {
        Fields g(sp, f.at("split"));
        SplitDesc split;
        split.extent = to_index(g.required("extent"), g.at("extent"));
        split.cost_ns = to_expr(g.required("cost_ns"), g.at("cost_ns"), n_symbols);
        if (py::handle a = g.optional("align")) split.align = to_int(a, g.at("align"));
        g.done();
        s.split = std::move(split);
    }
    f.done();
    return s;
}

ProgramDesc read_program(py::handle h) {
    Fields f(h, "program");
    ProgramDesc p;
    if (py::handle s = f.optional("symbols")) p.n_symbols = to_index(s, f.at("symbols"));
    p.n_inputs = to_index(f.required("inputs"), f.at("inputs"));
    p.n_outputs = to_index(f.required("outputs"), f.at("outputs"));
    p.arena_bytes = to_expr(f.required("arena_bytes"), f.at("arena_bytes"), p.n_symbols);
    py::list slots = to_list(f.required("slots"), f.at("slots"));
    for (size_t i = 0; i < slots.size(); ++i)
        p.slots.push_back(read_slot(slots[i], "slots[" + std::to_string(i) + "]", p.n_symbols));
    py::list steps = to_list(f.required("steps"), f.at("steps"));
    for (size_t i = 0; i < steps.size(); ++i)
        p.steps.push_back(read_step(steps[i], "steps[" + std::to_string(i) + "]", p.n_symbols));
    f.done();
    return p;
}

// ---- run ----------------------------------------------------------------------------------------
// An (address, nbytes) pair, or a DLPack tensor checked against the slot's dtype. The error
// messages name "input i" or "output i"; they are built only on an error (this runs every call).
Buffer read_buffer(py::handle h, const SlotDesc* slot, bool output, size_t index, std::vector<DlView>& views) {
    auto what = [&] { return (output ? "output " : "input ") + std::to_string(index); };
    if (PyTuple_Check(h.ptr())) {
        auto t = py::reinterpret_borrow<py::tuple>(h);
        if (t.size() != 2 || !PyLong_Check(t[0].ptr()) || !PyLong_Check(t[1].ptr()))
            throw RunError(what() + ": expected an (address, nbytes) pair of ints");
        unsigned long long address = PyLong_AsUnsignedLongLong(t[0].ptr());   // negative: an error
        unsigned long long nbytes = PyLong_AsUnsignedLongLong(t[1].ptr());
        if (PyErr_Occurred()) {
            PyErr_Clear();
            throw RunError(what() + ": address or nbytes out of range");
        }
        return Buffer{reinterpret_cast<void*>(static_cast<uintptr_t>(address)), static_cast<uint64_t>(nbytes)};
    }
    DlView v = take_dlpack<RunError>(h, what());
    if (slot) check_dtype<RunError>(v, slot->dtype, what());
    if (output && v.read_only) throw RunError(what() + ": the tensor is read-only");
    views.push_back(std::move(v));
    return Buffer{views.back().data, views.back().nbytes};
}

py::object run(const Engine& e, const py::sequence& inputs, const py::sequence& outputs,
               const std::vector<int64_t>& symbols, bool profile) {
    if (inputs.size() != static_cast<size_t>(e.n_inputs()) || outputs.size() != static_cast<size_t>(e.n_outputs()))
        throw RunError("the program takes " + std::to_string(e.n_inputs()) + " inputs and " +
                       std::to_string(e.n_outputs()) + " outputs; got " + std::to_string(inputs.size()) +
                       " and " + std::to_string(outputs.size()));
    std::vector<DlView> views;
    views.reserve(inputs.size() + outputs.size());
    std::vector<Buffer> in, out;
    in.reserve(inputs.size());
    out.reserve(outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
        in.push_back(read_buffer(inputs[i], e.input_slot(static_cast<int>(i)), false, i, views));
    for (size_t i = 0; i < outputs.size(); ++i)
        out.push_back(read_buffer(outputs[i], e.output_slot(static_cast<int>(i)), true, i, views));
    std::vector<StepTiming> timings;
    {
        py::gil_scoped_release nogil;
        e.run(in.data(), in.size(), out.data(), out.size(), symbols.data(), symbols.size(), profile ? &timings : nullptr);
    }
    if (!profile) return py::none();
    py::list records;
    for (const StepTiming& t : timings) records.append(py::make_tuple(t.step, t.chunk, t.thread, t.start_ns, t.end_ns));
    return records;
}

// ---- C interface through a capsule ----------------------------------------------------------------
struct CapiHandle {
    cuvil_engine_api_v1 api;  // first: the capsule's pointer is the api struct
    std::shared_ptr<const Engine> engine;
};

int capi_run(void* engine, const cuvil_buffer* inputs, const cuvil_buffer* outputs, const int64_t* symbols,
             char* err, size_t err_size) {
    const auto* e = static_cast<const Engine*>(engine);
    try {
        e->run(inputs, e->n_inputs(), outputs, e->n_outputs(), symbols, e->n_symbols(), nullptr);
        return 0;
    } catch (const std::exception& ex) {
        if (err && err_size) {
            std::strncpy(err, ex.what(), err_size - 1);
            err[err_size - 1] = '\0';
        }
        return -1;
    }
}

py::object make_capsule(std::shared_ptr<const Engine> engine) {
    auto* h = new CapiHandle{{CUVIL_ENGINE_ABI_VERSION, static_cast<uint32_t>(engine->n_inputs()),
                              static_cast<uint32_t>(engine->n_outputs()), static_cast<uint32_t>(engine->n_symbols()),
                              const_cast<Engine*>(engine.get()), capi_run},
                             engine};
    PyObject* cap = PyCapsule_New(&h->api, CUVIL_ENGINE_CAPSULE, [](PyObject* c) {
        delete reinterpret_cast<CapiHandle*>(PyCapsule_GetPointer(c, CUVIL_ENGINE_CAPSULE));
    });
    if (!cap) {
        delete h;
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
}

}  // namespace

Expr cuvil::read_expr(py::handle h, const std::string& where, int n_symbols) { return to_expr(h, where, n_symbols); }

PYBIND11_MODULE(_native, m) {
    m.doc() = "Cuvil's native runtime: engines that run JIT-compiled kernels on a thread pool.";
    py::object cuvil_error = py::module_::import("cuvil.errors").attr("CuvilError");
    py::register_exception<ProgramError>(m, "ProgramError", cuvil_error);
    py::register_exception<RunError>(m, "RunError", cuvil_error);
    // a failed check raises CuvilIndexError itself (an IndexError, as eager raises)
    static py::handle index_error = py::object(py::module_::import("cuvil.errors").attr("CuvilIndexError")).release();
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CheckFailed& e) {
            PyErr_SetString(index_error.ptr(), e.what());
        }
    });
    m.attr("CAPSULE_NAME") = CUVIL_ENGINE_CAPSULE;
    m.attr("ABI_VERSION") = CUVIL_ENGINE_ABI_VERSION;

    m.def("get_num_threads", [] { return Pool::get().threads(); },
          "Threads that run one call: the pool's workers plus the calling thread.");
    m.def(
        "set_num_threads",
        [](int n) {
            if (n < 1 || n > 1024)
                throw py::value_error("set_num_threads: expected 1 to 1024 threads, got " + std::to_string(n));
            py::gil_scoped_release nogil;
            Pool::get().set_threads(n);
        },
        py::arg("n"));
    m.def("default_num_threads", &Pool::default_threads, "The CPUs this process may run on.");
    m.def(
        "routines",
        [] {
            auto at = [](auto* fn) { return reinterpret_cast<uintptr_t>(fn); };
            return std::map<std::string, uintptr_t>{{"cuvil_topk_f32", at(&cuvil_topk_f32)},
                                                    {"cuvil_topk_i64", at(&cuvil_topk_i64)},
                                                    {"cuvil_topk_i32", at(&cuvil_topk_i32)},
                                                    {"cuvil_topk_i8", at(&cuvil_topk_i8)}};
        },
        "The addresses of the runtime routines generated kernels may call (select.h), by symbol.");
    m.def("spin_us", [] { return static_cast<int64_t>(Pool::get().spin().count()); },
          "Microseconds a thread out of work polls before it sleeps ($CUVIL_SPIN_US when the pool started).");

    py::class_<JitModule, std::shared_ptr<JitModule>>(m, "JitModule",
                                                      "The kernels of one JIT-compiled module; `owner` keeps their code alive.")
        .def(py::init([](py::object owner, const std::vector<std::tuple<std::string, uintptr_t, int, int, bool>>& ks) {
                 std::vector<KernelInfo> kernels;
                 for (auto& [name, address, n_slots, n_dims, split] : ks)
                     kernels.push_back({name, address, n_slots, n_dims, split});
                 std::shared_ptr<void> keep(new py::object(std::move(owner)), [](void* p) {
                     py::gil_scoped_acquire gil;
                     delete static_cast<py::object*>(p);
                 });
                 return std::make_shared<JitModule>(std::move(kernels), std::move(keep));
             }),
             py::arg("owner"), py::arg("kernels"),
             "kernels: (name, address, n_slots, n_dims, splittable) for each kernel of the module")
        .def_property_readonly("kernels", [](const JitModule& jm) {
            std::vector<std::tuple<std::string, uintptr_t, int, int, bool>> out;
            for (const KernelInfo& k : jm.kernels()) out.emplace_back(k.name, k.address, k.n_slots, k.n_dims, k.splittable);
            return out;
        });

    py::class_<Engine, std::shared_ptr<Engine>>(m, "Engine", "A validated program; see cuvil.runtime.engine.")
        .def(py::init([](std::shared_ptr<JitModule> module, py::handle program, int64_t min_chunk_ns) {
                 EngineOptions options;
                 options.min_chunk_ns = min_chunk_ns;
                 return std::make_shared<Engine>(std::move(module), read_program(program), options);
             }),
             py::arg("module"), py::arg("program"), py::kw_only(), py::arg("min_chunk_ns") = EngineOptions{}.min_chunk_ns)
        .def("run", &run, py::arg("inputs"), py::arg("outputs"), py::arg("symbols") = std::vector<int64_t>{},
             py::arg("profile") = false,
             "Runs one call with the GIL released. Each input/output is an (address, nbytes) pair or a DLPack "
             "tensor. With profile=True returns [(step, chunk, thread, start_ns, end_ns)], else None.")
        .def("capsule", [](std::shared_ptr<Engine> self) { return make_capsule(std::move(self)); },
             "A PyCapsule named 'cuvil.engine' holding a cuvil_engine_api_v1 (native/include/cuvil/engine_capi.h).")
        .def_property_readonly("num_inputs", &Engine::n_inputs)
        .def_property_readonly("num_outputs", &Engine::n_outputs)
        .def_property_readonly("num_symbols", &Engine::n_symbols)
        .def_property_readonly("num_steps", &Engine::n_steps);
    bind_tensor_call(m);
    bind_state_snapshot(m);
}
