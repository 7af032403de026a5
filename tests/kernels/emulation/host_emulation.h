// host_emulation.h: run streamrt's kernel sources (kernels/*.hip) on the host, for tests.
//
// Each GPU thread of a block is a fiber (ucontext) on the calling OS thread. A
// round runs every unfinished fiber until it reaches __syncthreads() or returns;
// the block is done when all have returned. A round in which some threads
// returned while others wait at a barrier is reported (the kernel's barriers
// diverge: a hang or undefined behaviour on a GPU) and aborts. Blocks run one
// after another, so a kernel that relies on blocks running concurrently would
// not work here (none of streamrt's does). The threads of a block share the
// kernel's __shared__ variables (function-local statics).
//
// This checks the C++ of the kernels, barriers included, on machines without a
// GPU; it says nothing about a GPU's memory model or timing.
//
// Build: g++ -std=c++20 -O1 -shared -fPIC -I kernels emu_kernels.cpp
#pragma once

#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#define STREAMRT_HOST_EMULATION 1

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline dim3 threadIdx;  // the running fiber's; set by the scheduler before each switch
inline dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict

struct SrtEmuFiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    dim3 tid;
    bool done = false;
};

inline ucontext_t srt_emu_scheduler;
inline SrtEmuFiber* srt_emu_current = nullptr;
inline std::function<void()>* srt_emu_body = nullptr;

inline void __syncthreads() { swapcontext(&srt_emu_current->ctx, &srt_emu_scheduler); }

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    const unsigned long long old = *p;  // one OS thread: no race
    *p = old + v;
    return old;
}

inline int atomicMax(int* p, int v) {
    const int old = *p;  // one OS thread: no race
    if (v > old) *p = v;
    return old;
}

// The device clocks: srt_host_cycles() counts nanoseconds; srt_host_timer_ns() is the same clock
// advancing in steps of srt_emu_timer_step_ns (1: every nanosecond), like a coarse %globaltimer.
inline unsigned long long srt_emu_timer_step_ns = 1;

inline unsigned long long srt_host_cycles() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// A hold-up to inject: after timer read number srt_emu_stall_at_read (1-based; 0: never), the
// thread spins srt_emu_stall_ns before going on, as a preempted thread would between two reads.
inline unsigned long long srt_emu_stall_at_read = 0;
inline unsigned long long srt_emu_stall_ns = 0;
inline unsigned long long srt_emu_timer_reads = 0;

inline unsigned long long srt_host_timer_ns() {
    const unsigned long long now = srt_host_cycles();
    if (++srt_emu_timer_reads == srt_emu_stall_at_read) {
        const unsigned long long until = srt_host_cycles() + srt_emu_stall_ns;
        while (srt_host_cycles() < until) {
        }
    }
    return now - now % srt_emu_timer_step_ns;
}

inline void srt_emu_trampoline() {
    (*srt_emu_body)();
    srt_emu_current->done = true;  // returning resumes the scheduler (uc_link)
}

__attribute__((noinline)) inline void srt_emu_make_fiber(SrtEmuFiber& f, dim3 tid) {
    constexpr size_t kStack = 128 * 1024;
    f.tid = tid;
    f.stack.reset(new char[kStack]);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &srt_emu_scheduler;
    makecontext(&f.ctx, srt_emu_trampoline, 0);
}

// Run body() once per thread of a grid x block launch.
inline void srt_emu_launch(dim3 grid, dim3 block, std::function<void()> body) {
    gridDim = grid;
    blockDim = block;
    srt_emu_body = &body;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = dim3{bx, by, bz};
                std::vector<SrtEmuFiber> fibers(block.x * block.y * block.z);
                size_t i = 0;
                for (unsigned tz = 0; tz < block.z; ++tz)
                    for (unsigned ty = 0; ty < block.y; ++ty)
                        for (unsigned tx = 0; tx < block.x; ++tx) srt_emu_make_fiber(fibers[i++], dim3{tx, ty, tz});
                for (;;) {
                    size_t waiting = 0, finished = 0;
                    for (SrtEmuFiber& f : fibers) {
                        if (f.done) continue;
                        srt_emu_current = &f;
                        threadIdx = f.tid;
                        swapcontext(&srt_emu_scheduler, &f.ctx);
                        if (f.done) ++finished;
                        else ++waiting;
                    }
                    if (waiting == 0) break;
                    if (finished != 0) {
                        std::fprintf(stderr, "host emulation: block (%u,%u,%u): %zu threads returned while %zu wait at __syncthreads\n",
                                     bx, by, bz, finished, waiting);
                        std::abort();
                    }
                }
                srt_emu_current = nullptr;
            }
    srt_emu_body = nullptr;
}
