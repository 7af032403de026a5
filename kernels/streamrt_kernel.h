/* streamrt_kernel.h: the portability layer of streamrt's kernel sources.
 *
 * Every source in kernels/ is one HIP C++ dialect that compiles with hiprtc (AMD),
 * with NVRTC (NVIDIA, streamrt's cuda backend) and with NVRTC behind hiprtc
 * (the HIP-on-CUDA test harness). blockIdx/threadIdx/blockDim/gridDim,
 * __global__, __device__, __shared__, __syncthreads() and atomicAdd() are the
 * same on all of them; this header adds only what differs or is missing:
 *
 *   - fixed-width integer typedefs (NVRTC and hiprtc have no libc headers; the
 *     srt_ names cannot clash with typedefs a runtime compiler may predefine);
 *   - SRT_DEVICE for helper functions (hiprtc has no -default-device);
 *   - srt_timer_ticks(): a constant-rate device clock, and its default rate.
 *
 * The streamrt loader pastes this file into each source that includes it, so it
 * needs no include path and is part of the source hash of the kernel cache.
 * Kernels are declared literally as  extern "C" __global__ void name(params)
 * (the loader and the simulator read that declaration; do not hide it in a macro).
 */
#ifndef STREAMRT_KERNEL_H
#define STREAMRT_KERNEL_H

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
/* NVRTC: the cuda backend, and HIP-on-CUDA (__STREAMRT_HIP__ and __STREAMRT_HIP_ON_CUDA__ set too). */
#define SRT_PLATFORM_NVIDIA 1
#elif defined(__HIPCC_RTC__) || defined(__HIPCC__) || defined(__HIP__)
/* hiprtc on an AMD GPU. */
#define SRT_PLATFORM_AMD 1
#elif defined(STREAMRT_HOST_EMULATION)
/* The host emulation of tests/kernels supplies the built-ins and srt_host_timer_ns(). */
#define SRT_PLATFORM_HOST 1
#else
#error "streamrt kernels compile with NVRTC or hiprtc (see docs/kernels.md)"
#endif

typedef signed char srt_i8;
typedef unsigned char srt_u8;
typedef int srt_i32;
typedef unsigned int srt_u32;
typedef long long srt_i64;
typedef unsigned long long srt_u64;

static_assert(sizeof(srt_i32) == 4 && sizeof(srt_u32) == 4, "32-bit ints");
static_assert(sizeof(srt_i64) == 8 && sizeof(srt_u64) == 8, "64-bit ints");
static_assert(sizeof(void*) == 8, "64-bit device pointers");

/* A 16-byte value, for wide zero stores (the address must be 16-byte aligned). */
struct alignas(16) srt_u128 {
    srt_u64 lo;
    srt_u64 hi;
};

#define SRT_DEVICE __device__ __forceinline__

SRT_DEVICE srt_i64 srt_min_i64(srt_i64 a, srt_i64 b) { return a < b ? a : b; }
SRT_DEVICE srt_i64 srt_max_i64(srt_i64 a, srt_i64 b) { return a > b ? a : b; }
/* ceil(a / b) for a >= 0, b > 0. */
SRT_DEVICE srt_i64 srt_ceil_div(srt_i64 a, srt_i64 b) { return (a + b - 1) / b; }

/* srt_timer_ticks(): a constant-rate device clock (not the shader clock, which follows the boost clock).
 *   NVIDIA: %globaltimer, in nanoseconds (SRT_TIMER_TICKS_PER_US = 1000). It may advance in
 *           steps (of about a microsecond on some GPUs), not every nanosecond.
 *   AMD:    wall_clock64(), at hipDeviceAttributeWallClockRate kHz; 100 MHz on the gfx9
 *           (MI100/MI200/MI300) and RDNA parts, the default here. Pass the real rate
 *           (kHz / 1000 ticks per microsecond) where a kernel takes one.
 * srt_cycles(): a fine-grained counter of unknown, roughly constant rate, to interpolate
 *   between the timer's steps (NVIDIA: clock64(), the SM's cycles; AMD: the wall clock itself). */
#if defined(SRT_PLATFORM_NVIDIA)
#define SRT_TIMER_TICKS_PER_US 1000.0
SRT_DEVICE srt_u64 srt_timer_ticks() {
    srt_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
SRT_DEVICE srt_u64 srt_cycles() { return (srt_u64)clock64(); }
#elif defined(SRT_PLATFORM_AMD)
#define SRT_TIMER_TICKS_PER_US 100.0
SRT_DEVICE srt_u64 srt_timer_ticks() { return (srt_u64)wall_clock64(); }
SRT_DEVICE srt_u64 srt_cycles() { return (srt_u64)wall_clock64(); }
#else
#define SRT_TIMER_TICKS_PER_US 1000.0
SRT_DEVICE srt_u64 srt_timer_ticks() { return srt_host_timer_ns(); }
SRT_DEVICE srt_u64 srt_cycles() { return srt_host_cycles(); }
#endif

#endif /* STREAMRT_KERNEL_H */
