// The fingerprint's per-chunk sums (sdcguard.fingerprints, whose docstring defines them): SA and SB of every chunk
// of 16384 32-bit words, one thread block per chunk. Each thread multiplies-and-adds a strided share of the chunk's
// words (uint4 loads when the chunk is whole and aligned), then a warp-shuffle reduction. Unsigned 32-bit arithmetic
// wraps mod 2**32, as the definition says; the signed right shift is arithmetic in CUDA C++. The weight tables
// (2 x 64 KiB) stay in L2, so the data is read once. Not a golden-vector kernel: the host build does not compile it.
#define CHUNK 16384
extern "C" __global__ void sdcguard_chunk_sums(
    const unsigned int* __restrict__ words, long long nwords,
    const unsigned int* __restrict__ T, const unsigned int* __restrict__ U,
    unsigned int* __restrict__ out_a, unsigned int* __restrict__ out_b)
{
    long long base = (long long)blockIdx.x * CHUNK;
    long long left = nwords - base;
    int n = left < CHUNK ? (int)left : CHUNK;
    unsigned int a = 0u, b = 0u;
    const unsigned int* w = words + base;
    if (n == CHUNK && (((unsigned long long)w) & 15ull) == 0ull) {
        const uint4* w4 = (const uint4*)w;
        const uint4* t4 = (const uint4*)T;
        const uint4* u4 = (const uint4*)U;
        for (int i = threadIdx.x; i < CHUNK / 4; i += blockDim.x) {
            uint4 x = w4[i];
            uint4 t = __ldg(t4 + i);
            uint4 u = __ldg(u4 + i);
            a += x.x * t.x + x.y * t.y + x.z * t.z + x.w * t.w;
            b += (unsigned int)(((int)x.x) >> 16) * u.x + (unsigned int)(((int)x.y) >> 16) * u.y
               + (unsigned int)(((int)x.z) >> 16) * u.z + (unsigned int)(((int)x.w) >> 16) * u.w;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            unsigned int x = w[i];
            a += x * T[i];
            b += (unsigned int)(((int)x) >> 16) * U[i];
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, off);
        b += __shfl_down_sync(0xffffffffu, b, off);
    }
    __shared__ unsigned int sa[32], sb[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sa[warp] = a; sb[warp] = b; }
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + 31) >> 5;
        a = lane < nwarps ? sa[lane] : 0u;
        b = lane < nwarps ? sb[lane] : 0u;
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, off);
            b += __shfl_down_sync(0xffffffffu, b, off);
        }
        if (lane == 0) { out_a[blockIdx.x] = a; out_b[blockIdx.x] = b; }
    }
}
