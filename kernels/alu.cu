// Integer ALU chains: multiply-add, shifts, rotates, and/or/not, popcount and high-half multiplies, per element,
// 'rounds' times. The exact result is plain modular integer arithmetic (reference: sdcguard/golden/reference.py).
//
// Launch: any grid, block 256; grid-stride loop over n elements. Per round r:
//   x = x*mul[r] + add[r]; x ^= x >> s1[r]; x = rotl(x, s2[r]); x += popc(x ^ y); x ^= mulhi(x, mul[r]);
//   y = (y & ~x) | (x & add[r]);            and finally out = x ^ y.
#include "sdc_common.cuh"

__device__ __forceinline__ sdc_u32 sdc_popc(sdc_u32 x) { return (sdc_u32)__popc(x); }
__device__ __forceinline__ sdc_u64 sdc_popc(sdc_u64 x) { return (sdc_u64)__popcll(x); }
__device__ __forceinline__ sdc_u32 sdc_mulhi(sdc_u32 a, sdc_u32 b) { return __umulhi(a, b); }
__device__ __forceinline__ sdc_u64 sdc_mulhi(sdc_u64 a, sdc_u64 b) { return __umul64hi(a, b); }

template <typename T>
__device__ __forceinline__ void alu_chain(const T* x, const T* y, const T* mul, const T* add, const T* s1,
                                          const T* s2, T* out, sdc_u32* smids, int n, int rounds) {
    sdc_record_sm(smids);
    const int bits = (int)(8 * sizeof(T));
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        T a = x[i], b = y[i];
        for (int r = 0; r < rounds; ++r) {
            const T m = mul[r], c = add[r];
            const int sh1 = (int)s1[r], sh2 = (int)s2[r];  // both in [1, bits-1]
            a = a * m + c;
            a ^= a >> sh1;
            a = (a << sh2) | (a >> (bits - sh2));
            a += sdc_popc((T)(a ^ b));
            a ^= sdc_mulhi(a, m);
            b = (b & ~a) | (a & c);
        }
        out[i] = a ^ b;
    }
}

extern "C" __global__ void alu_u32(const sdc_u32* x, const sdc_u32* y, const sdc_u32* mul, const sdc_u32* add,
                                   const sdc_u32* s1, const sdc_u32* s2, sdc_u32* out, sdc_u32* smids, int n,
                                   int rounds) {
    alu_chain<sdc_u32>(x, y, mul, add, s1, s2, out, smids, n, rounds);
}

extern "C" __global__ void alu_u64(const sdc_u64* x, const sdc_u64* y, const sdc_u64* mul, const sdc_u64* add,
                                   const sdc_u64* s1, const sdc_u64* s2, sdc_u64* out, sdc_u32* smids, int n,
                                   int rounds) {
    alu_chain<sdc_u64>(x, y, mul, add, s1, s2, out, smids, n, rounds);
}
