// GEMM known-answer tests on the tensor cores: C (MxN, f32) = A (MxK, row-major) * B (KxN, row-major).
// The operands (see sdcguard/golden/inputs.py) make every product exact and every partial sum an exact multiple
// of one power of two, so the f32 accumulators hold the exact result whatever order the hardware adds in.
//
// fp8 (e4m3) needs sm_89 or newer: compiled for an older architecture, gemm_mma_fp8 is an empty kernel that the
// backends never launch there.
//
// Launch: grid (N/32, M/16), block 128 (4 warps). Warp w of block (bx, by) computes the 16x8 tile at rows
// 16*by.., columns 8*(4*bx + w)... Fragments are loaded straight from global memory: this is a correctness test of
// the tensor cores, not a fast GEMM.
#include "sdc_common.cuh"

#define SDC_WARPS 4

__device__ __forceinline__ sdc_u32 sdc_pack16(sdc_u16 lo, sdc_u16 hi) {
    return (sdc_u32)lo | ((sdc_u32)hi << 16);
}

template <int BF16>
__device__ __forceinline__ void gemm_mma_16bit(const sdc_u16* A, const sdc_u16* B, float* C, sdc_u32* smids,
                                               int M, int N, int K) {
    sdc_record_sm(smids);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.y * 16, col0 = (blockIdx.x * SDC_WARPS + warp) * 8;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < K; k0 += 16) {
        const sdc_u16* a_lo = A + (size_t)(row0 + g) * K + k0 + 2 * t;
        const sdc_u16* a_hi = a_lo + (size_t)8 * K;
        const sdc_u32 a[4] = {sdc_pack16(a_lo[0], a_lo[1]), sdc_pack16(a_hi[0], a_hi[1]),
                              sdc_pack16(a_lo[8], a_lo[9]), sdc_pack16(a_hi[8], a_hi[9])};
        const sdc_u16* b_col = B + (size_t)(k0 + 2 * t) * N + col0 + g;
        const sdc_u32 b[2] = {sdc_pack16(b_col[0], b_col[(size_t)N]),
                              sdc_pack16(b_col[(size_t)8 * N], b_col[(size_t)9 * N])};
        if (BF16) {
            sdc_mma_bf16(c, a, b);
        } else {
            sdc_mma_f16(c, a, b);
        }
    }
    float* c_lo = C + (size_t)(row0 + g) * N + col0 + 2 * t;
    float* c_hi = c_lo + (size_t)8 * N;
    c_lo[0] = c[0];
    c_lo[1] = c[1];
    c_hi[0] = c[2];
    c_hi[1] = c[3];
}

extern "C" __global__ void gemm_mma_fp16(const sdc_u16* A, const sdc_u16* B, float* C, sdc_u32* smids, int M,
                                         int N, int K) {
    gemm_mma_16bit<0>(A, B, C, smids, M, N, K);
}

extern "C" __global__ void gemm_mma_bf16(const sdc_u16* A, const sdc_u16* B, float* C, sdc_u32* smids, int M,
                                         int N, int K) {
    gemm_mma_16bit<1>(A, B, C, smids, M, N, K);
}

extern "C" __global__ void gemm_mma_tf32(const float* A, const float* B, float* C, sdc_u32* smids, int M, int N,
                                         int K) {
    sdc_record_sm(smids);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.y * 16, col0 = (blockIdx.x * SDC_WARPS + warp) * 8;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < K; k0 += 8) {
        const float* a_lo = A + (size_t)(row0 + g) * K + k0 + t;
        const float* a_hi = a_lo + (size_t)8 * K;
        const sdc_u32 a[4] = {sdc_f32_to_tf32(a_lo[0]), sdc_f32_to_tf32(a_hi[0]), sdc_f32_to_tf32(a_lo[4]),
                              sdc_f32_to_tf32(a_hi[4])};
        const float* b_col = B + (size_t)(k0 + t) * N + col0 + g;
        const sdc_u32 b[2] = {sdc_f32_to_tf32(b_col[0]), sdc_f32_to_tf32(b_col[(size_t)4 * N])};
        sdc_mma_tf32(c, a, b);
    }
    float* c_lo = C + (size_t)(row0 + g) * N + col0 + 2 * t;
    float* c_hi = c_lo + (size_t)8 * N;
    c_lo[0] = c[0];
    c_lo[1] = c[1];
    c_hi[0] = c[2];
    c_hi[1] = c[3];
}

__device__ __forceinline__ sdc_u32 sdc_pack8(sdc_u8 b0, sdc_u8 b1, sdc_u8 b2, sdc_u8 b3) {
    return (sdc_u32)b0 | ((sdc_u32)b1 << 8) | ((sdc_u32)b2 << 16) | ((sdc_u32)b3 << 24);
}

extern "C" __global__ void gemm_mma_fp8(const sdc_u8* A, const sdc_u8* B, float* C, sdc_u32* smids, int M, int N,
                                        int K) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
    sdc_record_sm(smids);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.y * 16, col0 = (blockIdx.x * SDC_WARPS + warp) * 8;
    const size_t n = (size_t)N;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < K; k0 += 32) {
        const sdc_u8* a_lo = A + (size_t)(row0 + g) * K + k0 + 4 * t;
        const sdc_u8* a_hi = a_lo + (size_t)8 * K;
        const sdc_u32 a[4] = {sdc_pack8(a_lo[0], a_lo[1], a_lo[2], a_lo[3]),
                              sdc_pack8(a_hi[0], a_hi[1], a_hi[2], a_hi[3]),
                              sdc_pack8(a_lo[16], a_lo[17], a_lo[18], a_lo[19]),
                              sdc_pack8(a_hi[16], a_hi[17], a_hi[18], a_hi[19])};
        const sdc_u8* b_col = B + (size_t)(k0 + 4 * t) * n + col0 + g;
        const sdc_u32 b[2] = {sdc_pack8(b_col[0], b_col[n], b_col[2 * n], b_col[3 * n]),
                              sdc_pack8(b_col[16 * n], b_col[17 * n], b_col[18 * n], b_col[19 * n])};
        sdc_mma_fp8(c, a, b);
    }
    float* c_lo = C + (size_t)(row0 + g) * N + col0 + 2 * t;
    float* c_hi = c_lo + (size_t)8 * N;
    c_lo[0] = c[0];
    c_lo[1] = c[1];
    c_hi[0] = c[2];
    c_hi[1] = c[3];
#endif
}
