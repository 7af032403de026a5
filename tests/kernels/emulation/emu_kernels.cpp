// emu_kernels.cpp: the shipped kernel sources compiled for the host (see host_emulation.h),
// with one C entry point per kernel taking the launch shape; loaded by tests through ctypes.
#include "host_emulation.h"

#include "fmha_bwd_prepare.hip"
#include "fmha_bwd_prezero.hip"
#include "sleep.hip"
#include "verify.hip"

extern "C" {

void emu_fmha_bwd_prepare(unsigned grid_x, unsigned block_x, const srt_i32* seqstart_q, const srt_i32* seqstart_k,
                          srt_u8* workspace, srt_u8* result, srt_i32 batch, srt_i32 nhead, srt_i32 hdim_q, srt_i32 kM0,
                          srt_i32 kN0, srt_i32 num_cus, srt_i32 deterministic, srt_i32 max_seqlen_q, srt_i32 max_seqlen_k,
                          srt_i32 total_q_padded) {
    srt_emu_launch(dim3{grid_x, 1, 1}, dim3{block_x, 1, 1}, [=] {
        fmha_bwd_prepare(seqstart_q, seqstart_k, workspace, result, batch, nhead, hdim_q, kM0, kN0, num_cus, deterministic,
                         max_seqlen_q, max_seqlen_k, total_q_padded);
    });
}

void emu_fmha_bwd_dq_acc_prezero(unsigned grid_x, unsigned block_x, srt_u8* workspace, srt_i64 count_offset,
                                 srt_i64 dq_acc_offset, srt_i64 max_count) {
    srt_emu_launch(dim3{grid_x, 1, 1}, dim3{block_x, 1, 1},
                   [=] { fmha_bwd_dq_acc_prezero(workspace, count_offset, dq_acc_offset, max_count); });
}

void emu_fill_u32(unsigned grid_x, unsigned block_x, srt_u32* out, srt_u64 count, srt_u32 value, srt_u32 step) {
    srt_emu_launch(dim3{grid_x, 1, 1}, dim3{block_x, 1, 1}, [=] { fill_u32(out, count, value, step); });
}

void emu_checksum_u32(unsigned grid_x, unsigned block_x, const srt_u32* data, srt_u64 count, srt_u64* result) {
    srt_emu_launch(dim3{grid_x, 1, 1}, dim3{block_x, 1, 1}, [=] { checksum_u32(data, count, result); });
}

// Returns the nanoseconds the kernel really ran (by the fine clock), with the timer advancing
// in steps of timer_step_ns, and the thread held up for stall_ns after timer read number
// stall_at_read (0: never).
double emu_spin_sleep(double* out, double microseconds, double ticks_per_us, unsigned long long timer_step_ns,
                      unsigned long long stall_at_read, unsigned long long stall_ns) {
    srt_emu_timer_step_ns = timer_step_ns;
    srt_emu_timer_reads = 0;
    srt_emu_stall_at_read = stall_at_read;
    srt_emu_stall_ns = stall_ns;
    unsigned long long begin = 0, end = 0;
    srt_emu_launch(dim3{1, 1, 1}, dim3{1, 1, 1}, [=, &begin, &end] {
        begin = srt_host_cycles();
        spin_sleep(out, microseconds, ticks_per_us);
        end = srt_host_cycles();
    });
    srt_emu_timer_step_ns = 1;
    srt_emu_stall_at_read = 0;
    return (double)(end - begin);
}
}
