// Fast intrinsics: approximate special-function-unit results whose bits are defined per GPU architecture, not by
// IEEE. Checked against per-architecture goldens recorded on reference GPUs; never run by the numpy backend.
//
// Launch: any grid, block 256; grid-stride loop. out is 5 rows of n: __expf(x), __logf(y), __sinf(x), __cosf(x),
// __fdividef(x, y).
#include "sdc_common.cuh"

extern "C" __global__ void intrinsics_fp32(const float* x, const float* y, float* out, sdc_u32* smids, int n) {
    sdc_record_sm(smids);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float xi = x[i], yi = y[i];
        out[i] = __expf(xi);
        out[n + i] = __logf(yi);
        out[2 * n + i] = __sinf(xi);
        out[3 * n + i] = __cosf(xi);
        out[4 * n + i] = __fdividef(xi, yi);
    }
}
