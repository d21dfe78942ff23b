// Correctly rounded IEEE operations: division, square root, fused multiply-add (round to nearest even, explicit
// _rn intrinsics so no compiler flag can swap in an approximation), and RNE conversions fp32->fp16, fp32->bf16,
// fp64->fp32. Inputs stay in the normal range (no subnormal, flush-to-zero or overflow question arises).
//
// Launch: any grid, block 256; grid-stride loop over n elements. op: 0 div (a/b), 1 sqrt (a), 2 fma (a*b+c).
#include "sdc_common.cuh"

extern "C" __global__ void ieee_fp32(const float* a, const float* b, const float* c, float* out, sdc_u32* smids,
                                     int n, int op) {
    sdc_record_sm(smids);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float r;
        if (op == 0) {
            r = __fdiv_rn(a[i], b[i]);
        } else if (op == 1) {
            r = __fsqrt_rn(a[i]);
        } else {
            r = __fmaf_rn(a[i], b[i], c[i]);
        }
        out[i] = r;
    }
}

extern "C" __global__ void ieee_fp64(const double* a, const double* b, const double* c, double* out,
                                     sdc_u32* smids, int n, int op) {
    sdc_record_sm(smids);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        double r;
        if (op == 0) {
            r = __ddiv_rn(a[i], b[i]);
        } else if (op == 1) {
            r = __dsqrt_rn(a[i]);
        } else {
            r = __fma_rn(a[i], b[i], c[i]);
        }
        out[i] = r;
    }
}

extern "C" __global__ void cvt_fp32_fp16(const float* a, sdc_u16* out, sdc_u32* smids, int n) {
    sdc_record_sm(smids);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = sdc_f32_to_f16_rn(a[i]);
    }
}

extern "C" __global__ void cvt_fp32_bf16(const float* a, sdc_u16* out, sdc_u32* smids, int n) {
    sdc_record_sm(smids);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = sdc_f32_to_bf16_rn(a[i]);
    }
}

extern "C" __global__ void cvt_fp64_fp32(const double* a, float* out, sdc_u32* smids, int n) {
    sdc_record_sm(smids);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = __double2float_rn(a[i]);
    }
}
