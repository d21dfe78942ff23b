// Shared memory and atomics: per-block tree reductions in shared memory and shared/global atomic histograms.
// Integer sums modulo 2**32 / 2**64 are exact in any order, so the atomics' order never matters.
#include "sdc_common.cuh"

// Launch: grid nblocks = n / 256, block 256. out (u32): [0, nb) block sums, [nb, 2nb) block xors,
// [2nb, 2nb+256) histogram of x >> 24, [2nb+256] total sum, [2nb+257] total xor.
extern "C" __global__ void shared_reduce_u32(const sdc_u32* x, sdc_u32* out, sdc_u32* smids, int n) {
    __shared__ sdc_u32 s_sum[256];
    __shared__ sdc_u32 s_xor[256];
    __shared__ sdc_u32 s_hist[256];
    sdc_record_sm(smids);
    const int tid = threadIdx.x, nb = gridDim.x;
    const sdc_u32 v = x[blockIdx.x * 256 + tid];
    s_sum[tid] = v;
    s_xor[tid] = v;
    s_hist[tid] = 0u;
    __syncthreads();
    atomicAdd(&s_hist[v >> 24], 1u);
    for (int stride = 128; stride > 0; stride >>= 1) {
        if (tid < stride) {
            s_sum[tid] += s_sum[tid + stride];
            s_xor[tid] ^= s_xor[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        out[blockIdx.x] = s_sum[0];
        out[nb + blockIdx.x] = s_xor[0];
    }
    atomicAdd(&out[2 * nb + tid], s_hist[tid]);
    atomicAdd(&out[2 * nb + 256], v);
    atomicXor(&out[2 * nb + 257], v);
}

// Launch: any grid, block 256 (>= 64); grid-stride loop. out (u64): [0, 64) wrapping sums of the values whose top
// 6 bits are the bin, [64, 128) counts per bin, [128] xor of everything.
extern "C" __global__ void shared_bins_u64(const sdc_u64* x, sdc_u64* out, sdc_u32* smids, int n) {
    __shared__ sdc_u64 s_sum[64];
    __shared__ sdc_u64 s_cnt[64];
    sdc_record_sm(smids);
    const int tid = threadIdx.x;
    if (tid < 64) {
        s_sum[tid] = 0ull;
        s_cnt[tid] = 0ull;
    }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + tid; i < n; i += gridDim.x * blockDim.x) {
        const sdc_u64 v = x[i];
        const int bin = (int)(v >> 58);
        atomicAdd(&s_sum[bin], v);
        atomicAdd(&s_cnt[bin], 1ull);
        atomicXor(&out[128], v);
    }
    __syncthreads();
    if (tid < 64) {
        atomicAdd(&out[tid], s_sum[tid]);
        atomicAdd(&out[64 + tid], s_cnt[tid]);
    }
}
