// sleep.hip: a kernel that occupies its stream for a requested time (streamrt issue 6, kernel (b)).
//
//   spin_sleep(out, microseconds, ticks_per_us)
//
// Thread 0 of block 0 spins on the device's constant-rate clock (srt_timer_ticks:
// %globaltimer on NVIDIA, wall_clock64() on AMD) until `microseconds` have passed;
// every other thread returns at once, so launch it as grid 1, block 1.
// ticks_per_us is the clock rate (AMD: hipDeviceAttributeWallClockRate / 1000);
// 0 or less means the platform default, SRT_TIMER_TICKS_PER_US. When `out` is not
// NULL the kernel writes out[0] = the time it spun, in microseconds, and out[1] = the
// rate it used.
//
// A clock that advances in steps (NVIDIA's %globaltimer does, by about a microsecond on
// some GPUs) would make short sleeps off by up to a step. So once the spin has seen two
// steps, it measures the fine counter (srt_cycles: the SM's clock64) per timer tick between
// them, and times the parts before the first step and after the latest one in cycles:
// the sleep then ends within a few cycles of the requested time. Sleeps shorter than two
// steps count from the first step instead (never short; up to two steps long).
//
// Never short, even if the thread is held up between two clock reads (a preempted
// emulation thread; time-sliced compute): each timer read is bracketed by two cycle
// reads, so the cycle count at a step is known to lie between the cycles read before the
// previous timer read and the cycles read after this one. The spin uses the bounds that
// make its estimate a lower bound: the earliest start of the pre-step part, the latest end
// of the last step, and the largest cycles-per-tick they allow. Unhindered, the bounds
// are a loop iteration apart, which is all the precision they cost.
#include "streamrt_kernel.h"

// Spin until `ticks` timer ticks have passed since the call; returns the ticks spun (at most the time it really spun).
SRT_DEVICE double srt_spin_ticks(srt_u64 ticks) {
    const srt_u64 c0 = srt_cycles();
    srt_u64 prev_t = srt_timer_ticks();
    srt_u64 prev_before = c0;  // cycles read before prev_t was read
    srt_u64 first_t = 0, first_lo = 0, last_t = 0, last_hi = 0;  // the first and the latest step seen, with bounds
    int steps = 0;
    for (;;) {
        const srt_u64 before = srt_cycles();
        const srt_u64 t = srt_timer_ticks();
        const srt_u64 after = srt_cycles();
        if (t != prev_t) {  // a step to t happened after prev_t was read: its cycles lie in [prev_before, after]
            if (steps == 0) {
                first_t = t;
                first_lo = prev_before;
            }
            last_t = t;
            last_hi = after;
            if (steps < 2) ++steps;
        }
        prev_t = t;
        prev_before = before;
        if (steps >= 2) {
            const double cycles_per_tick = (double)(last_hi - first_lo) / (double)(last_t - first_t);  // >= the true rate
            const double spun = (double)(last_t - first_t) + ((double)(first_lo - c0) + ((double)after - (double)last_hi)) / cycles_per_tick;
            if (spun >= (double)ticks) return spun;
        } else if (steps == 1 && t - first_t >= ticks) {
            return (double)(t - first_t);  // the start was before first_t: never short
        }
    }
}

extern "C" __global__ void spin_sleep(double* __restrict__ out, double microseconds, double ticks_per_us) {
    if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0 || blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) {
        return;
    }
    const double rate = ticks_per_us > 0.0 ? ticks_per_us : SRT_TIMER_TICKS_PER_US;
    const double wanted = microseconds > 0.0 ? microseconds * rate + 0.5 : 0.0;
    const srt_u64 ticks = wanted < 1.8e19 ? (srt_u64)wanted : 18000000000000000000ull;
    const double spun = ticks > 0 ? srt_spin_ticks(ticks) : 0.0;
    if (out != nullptr) {
        out[0] = spun / rate;
        out[1] = rate;
    }
}
