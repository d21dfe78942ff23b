// Host emulation of the CUDA built-ins the golden kernels use: the same kernels/*.cu text compiles with g++
// (-DSDC_HOST is implied, -include this file) and runs on the CPU, so CI checks every kernel's logic against the
// goldens without a GPU (sdcguard/golden/hostbuild.py drives it).
//
// Execution model: every CUDA thread of a block is a ucontext fiber; the fibers of one block run cooperatively on
// one OS thread (blocks one after another), so __syncthreads() and __syncwarp() are real barriers (a fiber waits by
// yielding until the whole block / warp has arrived) and atomics are trivially atomic. __shared__ becomes a static
// local: one copy shared by the block's fibers, reused by the next block (kernels initialize it, as on a GPU).
//
// Emulated, not hardware-exact (say so when reading results): %smid is a fake SM id (linear block index modulo
// sdc_host::g_fake_sms); the tensor-core mma.sync instructions are a warp collective that rebuilds A, B, C from
// every lane's registers in the PTX ISA's documented fragment layouts and accumulates in double (identical to the
// hardware on the golden operands, whose sums are exact, but not a model of its internal rounding); fast
// intrinsics (__expf, ...) are the C library's functions, so intrinsics outputs differ from any GPU's.
#pragma once
#ifndef SDC_HOST
#define SDC_HOST 1
#endif

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace sdc_host {

struct Fiber {
    ucontext_t ctx;
    dim3 tid;
    unsigned linear = 0;
    bool done = false;
};

inline dim3 g_block_idx, g_block_dim, g_grid_dim;
inline Fiber* g_cur = nullptr;
inline ucontext_t g_sched;
inline const std::function<void()>* g_body = nullptr;
inline unsigned g_nthreads = 0;
inline unsigned g_bar_count = 0, g_bar_gen = 0;
inline unsigned g_warp_count[32], g_warp_gen[32];
inline unsigned g_fake_sms = 132;

inline void yield() { swapcontext(&g_cur->ctx, &g_sched); }

inline unsigned linear_block() { return g_block_idx.x + g_grid_dim.x * (g_block_idx.y + g_grid_dim.y * g_block_idx.z); }

inline void fiber_entry() {
    (*g_body)();
    g_cur->done = true;  // returning resumes g_sched through uc_link
}

// Run `body` as every thread of every block of the grid.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
    const unsigned n = block.x * block.y * block.z;
    const size_t stack = 64 * 1024;
    std::vector<Fiber> fibers(n);
    std::vector<char> stacks(stack * n);
    g_grid_dim = grid;
    g_block_dim = block;
    g_nthreads = n;
    g_body = &body;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                g_block_idx = dim3{bx, by, bz};
                g_bar_count = 0;
                std::memset(g_warp_count, 0, sizeof g_warp_count);
                for (unsigned t = 0; t < n; ++t) {
                    Fiber& f = fibers[t];
                    f.tid = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                    f.linear = t;
                    f.done = false;
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = stacks.data() + stack * t;
                    f.ctx.uc_stack.ss_size = stack;
                    f.ctx.uc_link = &g_sched;
                    makecontext(&f.ctx, fiber_entry, 0);
                }
                unsigned done = 0;
                while (done < n) {
                    for (unsigned t = 0; t < n; ++t) {
                        if (fibers[t].done) continue;
                        g_cur = &fibers[t];
                        swapcontext(&g_sched, &fibers[t].ctx);
                        if (fibers[t].done) ++done;
                    }
                    if (done > 0 && done < n && g_bar_count > 0 && g_bar_count == n - done) {
                        std::fprintf(stderr, "sdc host: __syncthreads() not reached by every thread\n");
                        std::abort();
                    }
                }
            }
    g_cur = nullptr;
}

}  // namespace sdc_host

#define threadIdx (sdc_host::g_cur->tid)
#define blockIdx (sdc_host::g_block_idx)
#define blockDim (sdc_host::g_block_dim)
#define gridDim (sdc_host::g_grid_dim)

inline void __syncthreads() {
    using namespace sdc_host;
    const unsigned gen = g_bar_gen;
    if (++g_bar_count == g_nthreads) {
        g_bar_count = 0;
        ++g_bar_gen;
    } else {
        while (g_bar_gen == gen) yield();
    }
}

inline void __syncwarp(unsigned = 0xFFFFFFFFu) {
    using namespace sdc_host;
    const unsigned w = g_cur->linear >> 5;
    const unsigned size = (g_nthreads - 32 * w) < 32 ? (g_nthreads - 32 * w) : 32;
    const unsigned gen = g_warp_gen[w];
    if (++g_warp_count[w] == size) {
        g_warp_count[w] = 0;
        ++g_warp_gen[w];
    } else {
        while (g_warp_gen[w] == gen) yield();
    }
}

// ---- atomics (fibers never preempt each other, so plain read-modify-write is atomic)
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long o = *p; *p = o + v; return o;
}
inline unsigned atomicXor(unsigned* p, unsigned v) { unsigned o = *p; *p = o ^ v; return o; }
inline unsigned long long atomicXor(unsigned long long* p, unsigned long long v) {
    unsigned long long o = *p; *p = o ^ v; return o;
}
inline unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v) { unsigned o = *p; if (o == cmp) *p = v; return o; }

// ---- integer intrinsics
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

// ---- correctly rounded IEEE operations: the host's SSE/AVX (or NEON) units and glibc's exact fma
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __double2float_rn(double a) { return (float)a; }

// ---- fast intrinsics: the C library (NOT the GPU's approximations)
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __fdividef(float a, float b) { return a / b; }

// ---- the sdc_* device helpers of sdc_common.cuh
typedef unsigned char sdc_u8;
typedef unsigned short sdc_u16;
typedef unsigned int sdc_u32;

inline sdc_u32 sdc_smid() { return sdc_host::linear_block() % sdc_host::g_fake_sms; }

inline sdc_u32 sdc_f32_bits(float x) { sdc_u32 u; std::memcpy(&u, &x, 4); return u; }
inline float sdc_bits_f32(sdc_u32 u) { float x; std::memcpy(&x, &u, 4); return x; }

inline sdc_u16 sdc_f32_to_f16_rn(float x) {
    const sdc_u32 u = sdc_f32_bits(x);
    const sdc_u32 sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return (sdc_u16)(sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u));
    const int e = (int)(a >> 23);
    if (e < 113) {  // below 2**-14: an fp16 subnormal (or zero), in units of 2**-24
        if (e < 102) return (sdc_u16)sign;
        const sdc_u32 m = (a & 0x7FFFFFu) | 0x800000u;
        const int shift = 126 - e;
        sdc_u32 q = m >> shift;
        const sdc_u32 rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1u))) ++q;
        return (sdc_u16)(sign | q);
    }
    const sdc_u32 r = a - (112u << 23);  // rebias 127 -> 15
    sdc_u32 h = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
    if (h >= 0x7C00u) h = 0x7C00u;  // rounds past the largest half: infinity
    return (sdc_u16)(sign | h);
}

inline sdc_u16 sdc_f32_to_bf16_rn(float x) {
    const sdc_u32 u = sdc_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (sdc_u16)((u >> 16) | 0x40u);  // quiet NaN
    return (sdc_u16)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline sdc_u32 sdc_f32_to_tf32(float x) {  // cvt.rna: nearest, ties away from zero
    const sdc_u32 u = sdc_f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return u;
    return (u + 0x1000u) & 0xFFFFE000u;
}

inline float sdc_f16_to_f32(sdc_u16 h) {
    const sdc_u32 sign = (sdc_u32)(h & 0x8000u) << 16;
    const int e = (h >> 10) & 0x1F;
    const sdc_u32 m = h & 0x3FFu;
    if (e == 0) return sdc_bits_f32(sign) + (sign ? -1.0f : 1.0f) * std::ldexp((float)m, -24);
    if (e == 31) return sdc_bits_f32(sign | 0x7F800000u | (m << 13));
    return sdc_bits_f32(sign | ((sdc_u32)(e + 112) << 23) | (m << 13));
}

inline float sdc_bf16_to_f32(sdc_u16 h) { return sdc_bits_f32((sdc_u32)h << 16); }

inline float sdc_e4m3_to_f32(unsigned char b) {  // OCP e4m3 ("fn"): bias 7, no infinities
    const float sign = (b & 0x80u) ? -1.0f : 1.0f;
    const int e = (b >> 3) & 0xF, m = b & 0x7;
    if (e == 0xF && m == 0x7) return std::nanf("");
    if (e == 0) return sign * std::ldexp((float)m, -9);
    return sign * std::ldexp((float)(8 + m), e - 10);
}

namespace sdc_host {
struct MmaSlot {
    sdc_u32 a[32][4];
    sdc_u32 b[32][2];
    float c[32][4];
};
inline MmaSlot g_mma[32];

// kind 0: f16 m16n8k16, 1: bf16 m16n8k16, 2: tf32 m16n8k8, 3: e4m3 m16n8k32. See sdc_common.cuh for the layouts.
template <int KIND>
inline void mma(float* c, const sdc_u32* a, const sdc_u32* b) {
    const unsigned lane = g_cur->linear & 31, w = g_cur->linear >> 5;
    MmaSlot& s = g_mma[w];
    for (int i = 0; i < 4; ++i) { s.a[lane][i] = a[i]; s.c[lane][i] = c[i]; }
    s.b[lane][0] = b[0];
    s.b[lane][1] = b[1];
    __syncwarp();
    if (lane == 0) {
        const int K = KIND == 2 ? 8 : KIND == 3 ? 32 : 16;
        double A[16][32] = {}, B[32][8] = {};
        for (int L = 0; L < 32; ++L) {
            const int g = L >> 2, t = L & 3;
            if (KIND == 3) {
                auto f = [](sdc_u32 v, int j) { return (double)sdc_e4m3_to_f32((unsigned char)(v >> (8 * j))); };
                for (int j = 0; j < 4; ++j) {
                    A[g][4 * t + j] = f(s.a[L][0], j);
                    A[g + 8][4 * t + j] = f(s.a[L][1], j);
                    A[g][4 * t + 16 + j] = f(s.a[L][2], j);
                    A[g + 8][4 * t + 16 + j] = f(s.a[L][3], j);
                    B[4 * t + j][g] = f(s.b[L][0], j);
                    B[4 * t + 16 + j][g] = f(s.b[L][1], j);
                }
            } else if (KIND == 2) {
                auto f = [](sdc_u32 v) { return (double)sdc_bits_f32(v & 0xFFFFE000u); };
                A[g][t] = f(s.a[L][0]);
                A[g + 8][t] = f(s.a[L][1]);
                A[g][t + 4] = f(s.a[L][2]);
                A[g + 8][t + 4] = f(s.a[L][3]);
                B[t][g] = f(s.b[L][0]);
                B[t + 4][g] = f(s.b[L][1]);
            } else {
                auto f = [](sdc_u32 v, int hi) {
                    const sdc_u16 h = (sdc_u16)(hi ? v >> 16 : v & 0xFFFFu);
                    return (double)(KIND == 0 ? sdc_f16_to_f32(h) : sdc_bf16_to_f32(h));
                };
                for (int hi = 0; hi < 2; ++hi) {
                    A[g][2 * t + hi] = f(s.a[L][0], hi);
                    A[g + 8][2 * t + hi] = f(s.a[L][1], hi);
                    A[g][2 * t + 8 + hi] = f(s.a[L][2], hi);
                    A[g + 8][2 * t + 8 + hi] = f(s.a[L][3], hi);
                    B[2 * t + hi][g] = f(s.b[L][0], hi);
                    B[2 * t + 8 + hi][g] = f(s.b[L][1], hi);
                }
            }
        }
        for (int L = 0; L < 32; ++L) {
            const int g = L >> 2, t = L & 3;
            for (int i = 0; i < 4; ++i) {
                const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
                double acc = 0.0;
                for (int k = 0; k < K; ++k) acc += A[row][k] * B[k][col];
                s.c[L][i] = (float)((double)s.c[L][i] + acc);
            }
        }
    }
    __syncwarp();
    for (int i = 0; i < 4; ++i) c[i] = s.c[lane][i];
    __syncwarp();  // nobody refills the slot before every lane has read its results
}
}  // namespace sdc_host

inline void sdc_mma_f16(float* c, const sdc_u32* a, const sdc_u32* b) { sdc_host::mma<0>(c, a, b); }
inline void sdc_mma_bf16(float* c, const sdc_u32* a, const sdc_u32* b) { sdc_host::mma<1>(c, a, b); }
inline void sdc_mma_tf32(float* c, const sdc_u32* a, const sdc_u32* b) { sdc_host::mma<2>(c, a, b); }
inline void sdc_mma_fp8(float* c, const sdc_u32* a, const sdc_u32* b) { sdc_host::mma<3>(c, a, b); }
