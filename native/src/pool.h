// The process-wide thread pool. Callers of Engine::run work too: a run's own thread executes
// its tasks and the pool's workers help, so `threads()` counts the workers plus one.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <vector>

namespace cuvil {

// Something with queued work. A ticket posted to the pool makes one worker call run_one(),
// which runs queued tasks until that source has none left; a ticket that finds nothing is a no-op.
class TaskSource {
public:
    virtual ~TaskSource() = default;
    virtual void run_one(int worker) noexcept = 0;
};

class Pool {
public:
    static Pool& get();
    static int default_threads();  // the CPUs this process may run on

    explicit Pool(int threads);
    int threads() const { return threads_.load(std::memory_order_relaxed); }
    void set_threads(int threads);  // >= 1; waits for running tasks of the old workers
    void post(const std::shared_ptr<TaskSource>& source, int tickets);

    // How long a thread that ran out of work polls before it sleeps: a call's next step usually
    // comes within microseconds, and waking a sleeping thread costs tens of them. $CUVIL_SPIN_US
    // (read when the pool starts; default 50, 0: sleep at once) trades that for idle CPU time.
    std::chrono::microseconds spin() const { return spin_; }

private:
    void work(std::stop_token stop, int worker);
    bool spin_for_tickets(const std::stop_token& stop) const;

    std::mutex resize_mutex_;
    std::atomic<int> threads_{1};
    std::mutex mutex_;
    std::condition_variable_any wake_;
    std::deque<std::shared_ptr<TaskSource>> tickets_;
    std::atomic<size_t> pending_{0};  // tickets_.size(), readable without the lock
    std::chrono::microseconds spin_;
    // Declared last: workers stop and join before the queue and its mutex are destroyed.
    std::vector<std::jthread> workers_;
};

// 0 on a thread that is not a pool worker (a caller of run), else 1..threads-1.
int current_worker();

// Polls `ready` (with a pause between polls) for up to `limit`; true as soon as it holds.
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds limit) {
    if (limit.count() == 0) return ready();
    auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            asm volatile("yield");
#endif
        }
        if (std::chrono::steady_clock::now() >= until) return ready();
    }
}

}  // namespace cuvil
