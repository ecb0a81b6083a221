// A thread's floating-point modes: flush-to-zero, denormals-are-zero and the rounding mode (x86's
// MXCSR control bits, AArch64's FPCR). A call's tasks run on the pool's workers under its caller's
// modes, as they would on the caller's own thread, where `torch.set_flush_denormal` sets them:
// without this, the chunks a worker happened to run kept their denormals and the caller's did not.
// Elsewhere (RISC-V) the modes are not carried over.
#pragma once

#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace cuvil {

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kMxcsrFlags = 0x3F;  // the sticky exception flags: state, not modes
#endif

inline uint64_t fp_modes() {
#if defined(__x86_64__) || defined(__i386__)
    return _mm_getcsr() & ~kMxcsrFlags;
#elif defined(__aarch64__)
    uint64_t fpcr;
    asm volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr;
#else
    return 0;
#endif
}

inline void set_fp_modes(uint64_t modes) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(static_cast<unsigned>(modes) | (_mm_getcsr() & kMxcsrFlags));
#elif defined(__aarch64__)
    asm volatile("msr fpcr, %0" : : "r"(modes));
#else
    (void)modes;
#endif
}

// Runs the scope under `modes` when the thread's differ, and puts the thread's own back after.
class FpModesScope {
public:
    explicit FpModesScope(uint64_t modes) : own_(fp_modes()), changed_(modes != own_) {
        if (changed_) set_fp_modes(modes);
    }
    ~FpModesScope() {
        if (changed_) set_fp_modes(own_);
    }
    FpModesScope(const FpModesScope&) = delete;
    FpModesScope& operator=(const FpModesScope&) = delete;

private:
    uint64_t own_;
    bool changed_;
};

}  // namespace cuvil
