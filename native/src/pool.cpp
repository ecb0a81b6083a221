#include "pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace cuvil {

namespace {
thread_local int tl_worker = 0;
std::atomic<Pool*> g_pool{nullptr};

// A forked child has none of the parent's threads: forget the pool (leaking it; its mutex may be
// held by a thread that no longer exists) and let the next get() start a fresh one.
void forget_pool_in_child() { g_pool.store(nullptr); }
}  // namespace

int current_worker() { return tl_worker; }

int Pool::default_threads() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    unsigned n = std::thread::hardware_concurrency();
    return n ? static_cast<int>(n) : 1;
}

Pool& Pool::get() {
    static const int registered = pthread_atfork(nullptr, nullptr, forget_pool_in_child);
    (void)registered;
    Pool* pool = g_pool.load(std::memory_order_acquire);
    if (pool) return *pool;
    auto* fresh = new Pool(default_threads());
    if (g_pool.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;
    return *pool;
}

namespace {
std::chrono::microseconds spin_from_env() {
    const char* text = std::getenv("CUVIL_SPIN_US");
    if (!text || !*text) return std::chrono::microseconds{50};
    char* end = nullptr;
    long us = std::strtol(text, &end, 10);
    return std::chrono::microseconds{(*end || us < 0) ? 50 : std::min(us, 100000L)};
}
}  // namespace

Pool::Pool(int threads) : spin_(spin_from_env()) { set_threads(threads); }

void Pool::set_threads(int threads) {
    std::lock_guard<std::mutex> resize(resize_mutex_);
    workers_.clear();  // each jthread is asked to stop and joined
    threads_.store(threads, std::memory_order_relaxed);
    for (int w = 1; w < threads; ++w)
        workers_.emplace_back([this, w](std::stop_token stop) { work(stop, w); });
}

void Pool::post(const std::shared_ptr<TaskSource>& source, int tickets) {
    if (tickets <= 0 || threads() <= 1) return;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (int i = 0; i < tickets; ++i) tickets_.push_back(source);
        pending_.store(tickets_.size(), std::memory_order_release);
    }
    if (tickets == 1)
        wake_.notify_one();
    else
        wake_.notify_all();
}

bool Pool::spin_for_tickets(const std::stop_token& stop) const {
    return spin_until([&] { return pending_.load(std::memory_order_acquire) > 0 || stop.stop_requested(); }, spin_);
}

void Pool::work(std::stop_token stop, int worker) {
    tl_worker = worker;
    bool busy = false;  // ran a task just now: poll a while before sleeping
    for (;;) {
        if (busy) spin_for_tickets(stop);
        std::shared_ptr<TaskSource> source;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            if (!wake_.wait(lock, stop, [this] { return !tickets_.empty(); })) return;
            source = std::move(tickets_.front());
            tickets_.pop_front();
            pending_.store(tickets_.size(), std::memory_order_release);
        }
        source->run_one(worker);
        busy = true;
    }
}

}  // namespace cuvil
