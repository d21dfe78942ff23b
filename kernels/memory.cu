// Memory march tests over a buffer of 32-bit words (device memory, through L2), after cuda_memtest:
//   kind 0 constant pattern p (moving inversions: write p; ascending read p/write ~p; descending read ~p/write p)
//   kind 1 modulo-20: word i holds p when i % 20 == offset, ~p elsewhere
//   kind 2 address-in-address: word i holds 4*i + salt (its own byte offset, salted), mod 2**32
//   kind 3 random: word i holds fmix32(i * 0x9E3779B1 + salt)
// 'invert' complements the pattern. A read that does not match is counted, and the first one claims the error
// record: index, expected, actual, a second read of the same word (equal to expected: a transient read; not: the
// stored value is corrupt), the SM, the phase.
//
// Launch: any grid, any block; grid-stride loops (descending walks the buffer from the top).
// err layout (u32): [0] count, [1] index lo, [2] index hi, [3] expected, [4] actual, [5] second read, [6] SM,
//                   [7] claimed flag, [8] phase.
#include "sdc_common.cuh"

__device__ __forceinline__ sdc_u32 sdc_fmix32(sdc_u32 x) {
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ sdc_u32 sdc_pattern(sdc_u32 kind, sdc_u64 i, sdc_u32 p, sdc_u32 salt, sdc_u32 offset) {
    if (kind == 0) return p;
    if (kind == 1) return (i % 20u == offset) ? p : ~p;
    if (kind == 2) return (sdc_u32)(i * 4u) + salt;
    return sdc_fmix32((sdc_u32)i * 0x9E3779B1u + salt);
}

extern "C" __global__ void mem_write_u32(sdc_u32* buf, sdc_u64 n, sdc_u32 kind, sdc_u32 p, sdc_u32 salt,
                                         sdc_u32 offset, sdc_u32 invert, sdc_u32* smids) {
    sdc_record_sm(smids);
    const sdc_u32 flip = invert ? 0xFFFFFFFFu : 0u;
    const sdc_u64 stride = (sdc_u64)gridDim.x * blockDim.x;
    for (sdc_u64 i = (sdc_u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        buf[i] = sdc_pattern(kind, i, p, salt, offset) ^ flip;
    }
}

extern "C" __global__ void mem_check_u32(sdc_u32* buf, sdc_u64 n, sdc_u32 kind, sdc_u32 p, sdc_u32 salt,
                                         sdc_u32 offset, sdc_u32 invert, sdc_u32 rewrite, sdc_u32 descending,
                                         sdc_u32 phase, sdc_u32* err, sdc_u32* smids) {
    sdc_record_sm(smids);
    const sdc_u32 flip = invert ? 0xFFFFFFFFu : 0u;
    const sdc_u64 stride = (sdc_u64)gridDim.x * blockDim.x;
    for (sdc_u64 j = (sdc_u64)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        const sdc_u64 i = descending ? n - 1 - j : j;
        const sdc_u32 expect = sdc_pattern(kind, i, p, salt, offset) ^ flip;
        const sdc_u32 got = buf[i];
        if (got != expect) {
            atomicAdd(&err[0], 1u);
            if (atomicCAS(&err[7], 0u, 1u) == 0u) {
                err[1] = (sdc_u32)i;
                err[2] = (sdc_u32)(i >> 32);
                err[3] = expect;
                err[4] = got;
                err[5] = ((volatile sdc_u32*)buf)[i];  // second read of the failing word
                err[6] = sdc_smid();
                err[8] = phase;
            }
        }
        if (rewrite) buf[i] = ~expect;
    }
}
