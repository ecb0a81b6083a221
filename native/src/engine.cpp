#include "engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "fp_modes.h"
#include "pool.h"

namespace cuvil {

std::optional<DType> dtype_from_name(const std::string& name) {
    static const DType known[] = {
        {"f32", dl::kFloat, 32}, {"f16", dl::kFloat, 16}, {"bf16", dl::kBfloat, 16}, {"i64", dl::kInt, 64},
        {"i32", dl::kInt, 32},   {"i8", dl::kInt, 8},     {"i1", dl::kBool, 8},
    };
    for (const DType& d : known)
        if (d.name == name) return d;
    return std::nullopt;
}

namespace {

constexpr size_t kArenaAlign = 64;
constexpr size_t kMaxIdleArenas = 4;

std::string hex(uintptr_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << v;
    return s.str();
}

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
    throw ProgramError("invalid program: " + where + ": " + what);
}

const char* kind_name(SlotKind k) {
    switch (k) {
    case SlotKind::Input: return "input";
    case SlotKind::Output: return "output";
    case SlotKind::Arena: return "arena";
    case SlotKind::Const: return "const";
    case SlotKind::Status: return "status";
    }
    return "?";
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
JitModule::JitModule(std::vector<KernelInfo> kernels, std::shared_ptr<void> owner)
    : kernels_(std::move(kernels)), owner_(std::move(owner)) {
    for (size_t i = 0; i < kernels_.size(); ++i) {
        const KernelInfo& k = kernels_[i];
        std::string where = "kernel '" + k.name + "'";
        if (k.address == 0) throw ProgramError(where + " has a null address");
        if (k.n_slots < 0 || k.n_dims < 0) throw ProgramError(where + " has a negative slot or dim count");
        if (!by_address_.emplace(k.address, i).second)
            throw ProgramError(where + " has the same address as kernel '" +
                               kernels_[by_address_[k.address]].name + "'");
    }
}

const KernelInfo* JitModule::find(uintptr_t address) const {
    auto it = by_address_.find(address);
    return it == by_address_.end() ? nullptr : &kernels_[it->second];
}

// ---------------------------------------------------------------------------------------------
Engine::Engine(std::shared_ptr<const JitModule> module, ProgramDesc program, EngineOptions options)
    : module_(std::move(module)), program_(std::move(program)), options_(options) {
    if (!module_) throw ProgramError("an engine needs a JIT module");
    validate();
    for (size_t s = 0; s < program_.steps.size(); ++s) {
        const StepDesc& step = program_.steps[s];
        const KernelInfo* k = module_->find(step.kernel);
        StepPlan p;
        p.fn = reinterpret_cast<KernelFn>(step.kernel);
        p.buf_offset = total_bufs_;
        p.dim_offset = total_dims_;
        p.n_dims = step.dims.size() + (k->splittable ? 2 : 0);
        total_bufs_ += step.slots.size();
        total_dims_ += p.n_dims;
        plan_.push_back(std::move(p));
        if (step.deps.empty()) roots_.push_back(static_cast<int>(s));
        for (int d : step.deps) plan_[d].successors.push_back(static_cast<int>(s));
    }
    // The order one thread runs the steps in: of the ready ones, the highest priority first, ties
    // by step index, as the task queue would.
    std::vector<int> deps_left(program_.steps.size()), ready = roots_;
    for (size_t s = 0; s < program_.steps.size(); ++s) deps_left[s] = static_cast<int>(program_.steps[s].deps.size());
    while (!ready.empty()) {
        auto first = std::min_element(ready.begin(), ready.end(), [&](int a, int b) {
            int64_t pa = program_.steps[a].priority, pb = program_.steps[b].priority;
            return pa != pb ? pa > pb : a < b;
        });
        int s = *first;
        ready.erase(first);
        serial_order_.push_back(s);
        for (int t : plan_[s].successors)
            if (--deps_left[t] == 0) ready.push_back(t);
    }
}

Engine::~Engine() {
    for (auto& [bytes, arena] : idle_arenas_) std::free(arena);
}

void Engine::validate() {
    ProgramDesc& p = program_;
    if (p.n_symbols < 0 || p.n_inputs < 0 || p.n_outputs < 0)
        refuse("program", "negative symbol, input or output count");
    if (options_.min_chunk_ns < 1) refuse("options", "min_chunk_ns must be positive");
    std::optional<int64_t> arena;
    if (p.arena_bytes.is_constant()) {
        arena = p.arena_bytes.value();
        if (*arena < 0) refuse("arena_bytes", "negative size " + std::to_string(*arena));
    }

    input_slot_.assign(p.n_inputs, -1);
    output_slot_.assign(p.n_outputs, -1);
    for (size_t i = 0; i < p.slots.size(); ++i) {
        const SlotDesc& sl = p.slots[i];
        std::string where = "slots[" + std::to_string(i) + "] (" + kind_name(sl.kind) + ")";
        auto nonneg = [&](const Expr& e, const char* what) {
            if (e.is_constant() && e.value() < 0)
                refuse(where, std::string("negative ") + what + " " + std::to_string(e.value()));
        };
        switch (sl.kind) {
        case SlotKind::Input:
        case SlotKind::Output: {
            bool in = sl.kind == SlotKind::Input;
            std::vector<int>& table = in ? input_slot_ : output_slot_;
            int n = in ? p.n_inputs : p.n_outputs;
            if (sl.index < 0 || sl.index >= n)
                refuse(where, "index " + std::to_string(sl.index) + " is out of range (the program has " +
                                  std::to_string(n) + (in ? " inputs)" : " outputs)"));
            if (table[sl.index] >= 0)
                refuse(where, std::string(in ? "input " : "output ") + std::to_string(sl.index) +
                                  " is already bound to slots[" + std::to_string(table[sl.index]) + "]");
            table[sl.index] = static_cast<int>(i);
            nonneg(sl.bytes, "size");
            break;
        }
        case SlotKind::Arena:
            nonneg(sl.offset, "offset");
            nonneg(sl.bytes, "size");
            if (arena && sl.offset.is_constant() && sl.bytes.is_constant() &&
                sl.offset.value() > *arena - sl.bytes.value())
                refuse(where, "offset " + std::to_string(sl.offset.value()) + " + size " +
                                  std::to_string(sl.bytes.value()) + " exceeds the arena size " +
                                  std::to_string(*arena));
            break;
        case SlotKind::Const:
            if (!sl.data && sl.data_bytes) refuse(where, "null data");
            break;
        case SlotKind::Status:
            status_slots_.push_back(static_cast<int>(i));
            break;
        }
    }
    for (int o = 0; o < p.n_outputs; ++o)
        if (output_slot_[o] < 0) refuse("outputs", "output " + std::to_string(o) + " is bound to no slot");

    for (size_t s = 0; s < p.steps.size(); ++s) {
        const StepDesc& st = p.steps[s];
        std::string step = "steps[" + std::to_string(s) + "]";
        const KernelInfo* k = module_->find(st.kernel);
        if (!k) {
            std::string known;
            for (const KernelInfo& ki : module_->kernels()) known += (known.empty() ? "" : ", ") + ki.name;
            refuse(step + ".kernel", "address " + hex(st.kernel) +
                                         " is not a kernel of this engine's JIT module (its kernels: " +
                                         (known.empty() ? "none" : known) + ")");
        }
        auto at = [&](const std::string& field) { return step + field + " (kernel '" + k->name + "')"; };
        if (static_cast<int>(st.slots.size()) != k->n_slots)
            refuse(at(".slots"), "has " + std::to_string(st.slots.size()) + " slots, the kernel takes " +
                                     std::to_string(k->n_slots));
        for (size_t j = 0; j < st.slots.size(); ++j)
            if (st.slots[j] < 0 || st.slots[j] >= static_cast<int>(p.slots.size()))
                refuse(at(".slots[" + std::to_string(j) + "]"),
                       "slot " + std::to_string(st.slots[j]) + " is out of range (the program has " +
                           std::to_string(p.slots.size()) + " slots)");
        if (static_cast<int>(st.dims.size()) != k->n_dims)
            refuse(at(".dims"), "has " + std::to_string(st.dims.size()) + " dims, the kernel takes " +
                                    std::to_string(k->n_dims));
        for (size_t j = 0; j < st.deps.size(); ++j) {
            int d = st.deps[j];
            if (d < 0 || d >= static_cast<int>(s))
                refuse(at(".deps[" + std::to_string(j) + "]"), "step " + std::to_string(d) + " is not an earlier step");
            if (std::find(st.deps.begin(), st.deps.begin() + j, d) != st.deps.begin() + j)
                refuse(at(".deps[" + std::to_string(j) + "]"), "step " + std::to_string(d) + " is listed twice");
        }
        if (k->splittable && !st.split) refuse(at(""), "the kernel is splittable but the step has no split");
        if (!k->splittable && st.split) refuse(at(".split"), "the step has a split but the kernel is not splittable");
        if (st.split) {
            if (st.split->extent < 0 || st.split->extent >= static_cast<int>(st.dims.size()))
                refuse(at(".split.extent"), "dim index " + std::to_string(st.split->extent) +
                                                " is out of range (the step has " + std::to_string(st.dims.size()) +
                                                " dims)");
            if (st.split->align < 1) refuse(at(".split.align"), "must be at least 1");
        }
    }
}

// ---------------------------------------------------------------------------------------------
void* Engine::take_arena(uint64_t& bytes) const {
    {
        std::lock_guard<std::mutex> lock(arena_mutex_);
        auto best = idle_arenas_.end();
        for (auto it = idle_arenas_.begin(); it != idle_arenas_.end(); ++it)
            if (it->first >= bytes && (best == idle_arenas_.end() || it->first < best->first)) best = it;
        if (best != idle_arenas_.end()) {
            void* arena = best->second;
            bytes = best->first;
            idle_arenas_.erase(best);
            return arena;
        }
    }
    uint64_t rounded = std::max<uint64_t>((bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign, kArenaAlign);
    void* arena = rounded < bytes ? nullptr : std::aligned_alloc(kArenaAlign, rounded);
    if (!arena) throw RunError("cannot allocate an arena of " + std::to_string(bytes) + " bytes");
    bytes = rounded;
    return arena;
}

void Engine::give_arena(void* arena, uint64_t bytes) const {
    std::lock_guard<std::mutex> lock(arena_mutex_);
    if (idle_arenas_.size() < kMaxIdleArenas) {
        try {
            idle_arenas_.emplace_back(bytes, arena);
            return;
        } catch (const std::bad_alloc&) {
        }
    }
    std::free(arena);
}

// ---------------------------------------------------------------------------------------------
// One call in flight: its evaluated buffers and dims, and the ready tasks (a task is one chunk of
// one step). Whoever finishes a step's last chunk releases its successors.
struct Task {
    int64_t priority;
    int step;
    int chunk;
};

// Which ready task a worker takes: the highest priority; among equals its own chunk (chunk c is
// worker c's, c modulo the threads), then the earliest step and chunk. Consecutive steps split
// their outer loops alike (batch-major, in equal parts), so a worker's own chunk mostly reads what
// it wrote in the step before, from its own core's cache; taken by another core, those lines
// cross between the cores first (2-thread CNN: a pooling step ran 2x slower than on one thread).
static bool runs_later(const Task& a, const Task& b, int worker, int threads) {
    if (a.priority != b.priority) return a.priority < b.priority;
    bool a_own = a.chunk % threads == worker, b_own = b.chunk % threads == worker;
    if (a_own != b_own) return b_own;
    if (a.step != b.step) return a.step > b.step;
    return a.chunk > b.chunk;
}

// Where one call's steps read and write, and how its split steps are chunked.
struct CallLayout {
    std::vector<char*> bufs;
    std::vector<int64_t> dims;
    std::vector<int> n_chunks;
    std::vector<int64_t> chunk_len;
    size_t total_tasks = 0;
};

class Call final : public TaskSource, public std::enable_shared_from_this<Call> {
public:
    // `layout` is read only by tasks, and every task ends before Engine::run returns.
    // Made on the calling thread: its floating-point modes are the ones the workers take on.
    Call(const Engine& engine, const CallLayout& layout, std::vector<StepTiming>* profile)
        : profile(profile), e_(engine), l_(layout), fp_modes_(fp_modes()) {}

    std::vector<StepTiming>* const profile;

    // One chunk of a step: its kernel on its buffers and dims (for a split step, the chunk's range).
    static StepTiming execute(const Engine::StepPlan& p, const CallLayout& l, const Task& t, int worker,
                              bool profile) {
        char** b = const_cast<char**>(l.bufs.data()) + p.buf_offset;
        const int64_t* d = l.dims.data() + p.dim_offset;
        StepTiming timing{t.step, t.chunk, worker, profile ? now_ns() : 0, 0};
        if (l.n_chunks[t.step] == 1) {
            p.fn(b, d);
        } else {
            int64_t local[32];
            std::vector<int64_t> heap;
            int64_t* own = local;
            if (p.n_dims > 32) {
                heap.resize(p.n_dims);
                own = heap.data();
            }
            std::memcpy(own, d, p.n_dims * sizeof(int64_t));
            own[0] = t.chunk * l.chunk_len[t.step];
            own[1] = std::min(d[1], own[0] + l.chunk_len[t.step]);
            p.fn(b, own);
        }
        if (profile) timing.end_ns = now_ns();
        return timing;
    }

    void start(size_t total_tasks) {
        const auto& steps = e_.program_.steps;
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.reserve(total_tasks);
        if (profile) profile->reserve(total_tasks);
        deps_left_.resize(steps.size());
        chunks_left_.assign(l_.n_chunks.begin(), l_.n_chunks.end());
        for (size_t s = 0; s < steps.size(); ++s) deps_left_[s] = static_cast<int>(steps[s].deps.size());
        steps_left_ = static_cast<int>(steps.size());
        int pushed = 0;
        for (int r : e_.roots_) pushed += push_step(r);
        lock.unlock();
        post(pushed - 1);
    }

    // The calling thread: run tasks of this call until every step is done.
    void help_until_done() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            if (steps_left_ == 0 && inflight_ == 0) return;
            Task t;
            if (pop(t, 0)) {
                lock.unlock();
                drive(t, 0);
                lock.lock();
            } else {  // the pool has the rest: poll a while for its progress, then sleep
                uint64_t seen = progress_.load(std::memory_order_relaxed);
                lock.unlock();
                spin_until([&] { return progress_.load(std::memory_order_acquire) != seen; }, Pool::get().spin());
                lock.lock();
                if (progress_.load(std::memory_order_relaxed) == seen) wake_.wait(lock);
            }
        }
    }

    void run_one(int worker) noexcept override {
        Task t;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!pop(t, worker)) return;
        }
        FpModesScope modes(fp_modes_);
        drive(t, worker);
    }

private:
    // Runs t, then further ready tasks of this call, until its queue is empty.
    void drive(Task t, int worker) noexcept {
        for (;;) {
            StepTiming timing = execute(e_.plan_[t.step], l_, t, worker, profile != nullptr);
            int pushed = 0;
            bool more, wake_caller;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                if (profile) profile->push_back(timing);  // reserved: cannot throw
                if (--chunks_left_[t.step] == 0) {
                    --steps_left_;
                    for (int s : e_.plan_[t.step].successors)
                        if (--deps_left_[s] == 0) pushed += push_step(s);
                }
                --inflight_;
                progress_.fetch_add(1, std::memory_order_release);
                more = pop(t, worker);
                if (more && pushed > 0) --pushed;
                wake_caller = pushed > 0 || (steps_left_ == 0 && inflight_ == 0);
            }
            if (wake_caller) wake_.notify_one();
            post(pushed);
            if (!more) return;
        }
    }

    int push_step(int s) {
        int64_t priority = e_.program_.steps[s].priority;
        for (int c = 0; c < l_.n_chunks[s]; ++c) ready_.push_back({priority, s, c});
        return l_.n_chunks[s];
    }

    // The task `worker` runs next (`runs_later`): a scan, the ready tasks being a few per thread.
    bool pop(Task& t, int worker) {
        if (ready_.empty()) return false;
        int threads = std::max(1, Pool::get().threads());
        auto best = ready_.begin();
        for (auto it = ready_.begin() + 1; it != ready_.end(); ++it)
            if (runs_later(*best, *it, worker, threads)) best = it;
        t = *best;
        *best = ready_.back();
        ready_.pop_back();
        ++inflight_;
        return true;
    }

    void post(int tickets) {
        if (tickets <= 0) return;
        Pool& pool = Pool::get();
        try {
            pool.post(shared_from_this(), std::min(tickets, pool.threads() - 1));
        } catch (const std::bad_alloc&) {
            // Fewer helpers; the calling thread still runs every task.
        }
    }

    const Engine& e_;
    const CallLayout& l_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::vector<Task> ready_;
    std::vector<int> deps_left_, chunks_left_;
    int steps_left_ = 0;
    int inflight_ = 0;
    std::atomic<uint64_t> progress_{0};  // tasks finished (changed under mutex_; polled without it)
    const uint64_t fp_modes_;
};

// ---------------------------------------------------------------------------------------------
void Engine::run(const Buffer* inputs, size_t n_inputs, const Buffer* outputs, size_t n_outputs,
                 const int64_t* symbols, size_t n_symbols, std::vector<StepTiming>* profile) const {
    const ProgramDesc& p = program_;
    if (n_inputs != static_cast<size_t>(p.n_inputs) || n_outputs != static_cast<size_t>(p.n_outputs) ||
        n_symbols != static_cast<size_t>(p.n_symbols))
        throw RunError("the program takes " + std::to_string(p.n_inputs) + " inputs, " +
                       std::to_string(p.n_outputs) + " outputs and " + std::to_string(p.n_symbols) +
                       " symbol values; got " + std::to_string(n_inputs) + ", " + std::to_string(n_outputs) +
                       " and " + std::to_string(n_symbols));
    // `where` builds the error location only when an expression fails.
    auto eval = [&](const Expr& e, auto&& where) {
        try {
            return e.eval(symbols);
        } catch (const EvalError& err) {
            throw RunError(where() + ": " + err.what());
        }
    };
    auto slot_at = [](size_t i, const char* field) { return "slots[" + std::to_string(i) + "]" + field; };

    int64_t arena_bytes = eval(p.arena_bytes, [] { return std::string("arena_bytes"); });
    if (arena_bytes < 0) throw RunError("arena_bytes evaluates to " + std::to_string(arena_bytes));

    // Per-thread scratch, reused call after call: no allocation per call once it has grown (a
    // thread runs one call at a time; kernels never call back into an engine).
    thread_local std::vector<char*> base;
    thread_local std::vector<std::pair<size_t, int64_t>> arena_slots;  // slot, offset
    thread_local CallLayout layout;
    // One status word per status slot, zeroed: a kernel whose check fails sets the check's bit there.
    thread_local std::vector<int32_t> status;
    status.assign(status_slots_.size(), 0);
    base.assign(p.slots.size(), nullptr);
    for (size_t k = 0; k < status_slots_.size(); ++k) base[status_slots_[k]] = reinterpret_cast<char*>(&status[k]);
    arena_slots.clear();
    for (size_t i = 0; i < p.slots.size(); ++i) {
        const SlotDesc& sl = p.slots[i];
        switch (sl.kind) {
        case SlotKind::Input:
        case SlotKind::Output: {
            bool in = sl.kind == SlotKind::Input;
            const Buffer& buf = (in ? inputs : outputs)[sl.index];
            int64_t want = eval(sl.bytes, [&] { return slot_at(i, ".bytes"); });
            auto what = [&] { return std::string(in ? "input " : "output ") + std::to_string(sl.index); };
            if (want < 0) throw RunError(what() + ": its size evaluates to " + std::to_string(want) + " bytes");
            if (buf.nbytes != static_cast<uint64_t>(want))
                throw RunError(what() + ": expected " + std::to_string(want) + " bytes, got " +
                               std::to_string(buf.nbytes));
            if (!buf.data && want > 0) throw RunError(what() + ": null data pointer");
            base[i] = static_cast<char*>(buf.data);
            break;
        }
        case SlotKind::Arena: {
            int64_t off = eval(sl.offset, [&] { return slot_at(i, ".offset"); });
            int64_t bytes = eval(sl.bytes, [&] { return slot_at(i, ".bytes"); });
            if (off < 0 || bytes < 0 || off > arena_bytes - bytes)
                throw RunError(slot_at(i, "") + ": arena range [" + std::to_string(off) + ", " +
                               std::to_string(off) + " + " + std::to_string(bytes) + ") is outside the arena of " +
                               std::to_string(arena_bytes) + " bytes");
            arena_slots.emplace_back(i, off);
            break;
        }
        case SlotKind::Const: base[i] = static_cast<char*>(sl.data); break;
        case SlotKind::Status: break;
        }
    }

    auto step_at = [](size_t s, const std::string& field) { return "steps[" + std::to_string(s) + "]" + field; };
    layout.dims.resize(total_dims_);
    layout.n_chunks.assign(p.steps.size(), 1);
    layout.chunk_len.assign(p.steps.size(), 0);
    const int threads = Pool::get().threads();
    size_t total_tasks = 0;
    for (size_t s = 0; s < p.steps.size(); ++s) {
        const StepDesc& st = p.steps[s];
        const StepPlan& plan = plan_[s];
        int64_t* d = layout.dims.data() + plan.dim_offset;
        size_t first = st.split ? 2 : 0;
        for (size_t j = 0; j < st.dims.size(); ++j)
            d[first + j] = eval(st.dims[j], [&] { return step_at(s, ".dims[" + std::to_string(j) + "]"); });
        if (st.split) {
            int64_t extent = d[2 + st.split->extent];
            if (extent < 0)
                throw RunError(step_at(s, "") + ": outer extent evaluates to " + std::to_string(extent));
            d[0] = 0;
            d[1] = extent;
            int64_t cost = eval(st.split->cost_ns, [&] { return step_at(s, ".split.cost_ns"); });
            int64_t total = 0;
            if (cost > 0 && __builtin_mul_overflow(cost, extent, &total)) total = INT64_MAX;
            int64_t n = std::min<int64_t>({threads, total / options_.min_chunk_ns, extent});
            if (n > 1) {
                int64_t align = st.split->align;
                int64_t len = ((extent + n - 1) / n + align - 1) / align * align;
                layout.chunk_len[s] = len;
                layout.n_chunks[s] = static_cast<int>((extent + len - 1) / len);
            }
        }
        total_tasks += layout.n_chunks[s];
    }

    struct ArenaLease {
        const Engine& e;
        uint64_t bytes;
        void* ptr;
        ~ArenaLease() {
            if (ptr) e.give_arena(ptr, bytes);
        }
    } lease{*this, static_cast<uint64_t>(arena_bytes), nullptr};
    if (arena_bytes > 0) lease.ptr = take_arena(lease.bytes);
    for (auto [slot, off] : arena_slots) base[slot] = static_cast<char*>(lease.ptr) + off;

    layout.bufs.resize(total_bufs_);
    for (size_t s = 0; s < p.steps.size(); ++s)
        for (size_t j = 0; j < p.steps[s].slots.size(); ++j)
            layout.bufs[plan_[s].buf_offset + j] = base[p.steps[s].slots[j]];

    if (p.steps.empty()) return;
    if (total_tasks == p.steps.size() && (threads == 1 || p.steps.size() == 1)) {
        // one chunk per step on this thread: the steps in the queue's order, without the queue,
        // its lock or the pool
        if (profile) profile->reserve(serial_order_.size());
        for (int s : serial_order_) {
            StepTiming timing = Call::execute(plan_[s], layout, Task{0, s, 0}, 0, profile != nullptr);
            if (profile) profile->push_back(timing);
        }
    } else {
        auto call = std::make_shared<Call>(*this, layout, profile);
        call->start(total_tasks);
        call->help_until_done();
    }
    for (size_t k = 0; k < status_slots_.size(); ++k) {
        if (status[k] == 0) continue;
        const std::vector<std::string>& errors = p.slots[status_slots_[k]].errors;
        size_t bit = static_cast<size_t>(__builtin_ctz(static_cast<uint32_t>(status[k])));
        throw CheckFailed(bit < errors.size() ? errors[bit]
                                              : "slots[" + std::to_string(status_slots_[k]) + "]: check " +
                                                    std::to_string(bit) + " failed");
    }
}

}  // namespace cuvil
