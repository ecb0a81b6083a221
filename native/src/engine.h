// The engine: a validated program of JIT-compiled kernels, run on the pool with one arena per call.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuvil/engine_capi.h"
#include "dlpack.h"
#include "expr.h"

namespace cuvil {

// A program the engine refuses to build.
struct ProgramError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A call the engine refuses to run (bad buffers or symbol values).
struct RunError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A call a kernel's check failed in (an index outside its table): the slot's error message.
struct CheckFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Kernel ABI. A splittable kernel gets dims = {begin, end, <its declared dims>...} and
// processes outer iterations [begin, end); any other kernel gets its declared dims only.
using KernelFn = void (*)(char** bufs, const int64_t* dims);

struct KernelInfo {
    std::string name;
    uintptr_t address = 0;
    int n_slots = 0;
    int n_dims = 0;  // declared dims, not counting begin/end
    bool splittable = false;
};

// The kernels of one JIT-compiled module. `owner` keeps the machine code alive (for example the
// llvmlite execution engine); every engine built on the module holds a reference to it.
class JitModule {
public:
    JitModule(std::vector<KernelInfo> kernels, std::shared_ptr<void> owner);
    const KernelInfo* find(uintptr_t address) const;
    const std::vector<KernelInfo>& kernels() const { return kernels_; }

private:
    std::vector<KernelInfo> kernels_;
    std::unordered_map<uintptr_t, size_t> by_address_;
    std::shared_ptr<void> owner_;
};

enum class SlotKind { Input, Output, Arena, Const, Status };

struct SlotDesc {
    SlotKind kind = SlotKind::Arena;
    int index = -1;         // input / output position
    Expr offset;            // arena
    Expr bytes;             // input / output / arena
    DType dtype;            // input / output / const
    void* data = nullptr;   // const
    uint64_t data_bytes = 0;
    std::shared_ptr<void> keepalive;  // const: owns the memory at `data`
    std::vector<std::string> errors;  // status: the message of the check of each bit
};

struct SplitDesc {
    int extent = 0;  // index into the step's declared dims: the outer range is [0, dims[extent])
    Expr cost_ns;    // estimated nanoseconds of one outer iteration
    int64_t align = 1;  // chunk boundaries are multiples of this
};

struct StepDesc {
    uintptr_t kernel = 0;
    std::vector<int> slots;
    std::vector<Expr> dims;
    std::vector<int> deps;
    int64_t priority = 0;
    std::optional<SplitDesc> split;
};

struct ProgramDesc {
    int n_symbols = 0;
    int n_inputs = 0;
    int n_outputs = 0;
    Expr arena_bytes;
    std::vector<SlotDesc> slots;
    std::vector<StepDesc> steps;
};

struct EngineOptions {
    int64_t min_chunk_ns = 25000;  // a split kernel's chunks carry at least this much work
};

using Buffer = cuvil_buffer;  // contiguous CPU memory of one input or output

struct StepTiming {
    int32_t step;
    int32_t chunk;
    int32_t thread;    // 0: the calling thread, 1..: pool workers
    int64_t start_ns;  // steady clock (CLOCK_MONOTONIC, as Python's time.monotonic_ns)
    int64_t end_ns;
};

class Engine {
public:
    Engine(std::shared_ptr<const JitModule> module, ProgramDesc program, EngineOptions options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Thread-safe. `profile`, when given, receives one record per executed kernel call.
    void run(const Buffer* inputs, size_t n_inputs, const Buffer* outputs, size_t n_outputs,
             const int64_t* symbols, size_t n_symbols, std::vector<StepTiming>* profile) const;

    int n_inputs() const { return program_.n_inputs; }
    int n_outputs() const { return program_.n_outputs; }
    int n_symbols() const { return program_.n_symbols; }
    int n_steps() const { return static_cast<int>(program_.steps.size()); }
    // The slot bound to an input / output position; null for an input no step uses.
    const SlotDesc* input_slot(int index) const { return slot_or_null(input_slot_[index]); }
    const SlotDesc* output_slot(int index) const { return slot_or_null(output_slot_[index]); }
    const ProgramDesc& program() const { return program_; }
    const JitModule& module() const { return *module_; }

private:
    friend class Call;
    struct StepPlan {
        KernelFn fn;
        size_t buf_offset;
        size_t dim_offset;
        size_t n_dims;  // including begin/end for splittable kernels
        std::vector<int> successors;
    };

    void validate();
    const SlotDesc* slot_or_null(int slot) const { return slot < 0 ? nullptr : &program_.slots[slot]; }
    void* take_arena(uint64_t& bytes) const;  // bytes: asked for in, capacity out
    void give_arena(void* arena, uint64_t bytes) const;

    std::shared_ptr<const JitModule> module_;
    ProgramDesc program_;
    EngineOptions options_;
    std::vector<StepPlan> plan_;
    std::vector<int> roots_;
    std::vector<int> serial_order_;  // the steps as one thread runs them
    std::vector<int> input_slot_, output_slot_;  // position -> slot index (-1: unused input)
    std::vector<int> status_slots_;  // the status slots, in slot order
    size_t total_bufs_ = 0, total_dims_ = 0;

    mutable std::mutex arena_mutex_;
    mutable std::vector<std::pair<uint64_t, void*>> idle_arenas_;
};

}  // namespace cuvil
