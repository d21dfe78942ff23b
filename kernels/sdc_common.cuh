// Shared by every golden-vector kernel. Compiled two ways from the same text:
//   - on a GPU by NVRTC (CuPy RawModule, see sdcguard/golden/loader.py): the inline PTX below;
//   - on the host by g++ with -DSDC_HOST -include host/cuda_host.h (the CI proof without a GPU): the emulation
//     functions of the same names from cuda_host.h.
// No CUDA toolkit header is included on purpose: NVRTC alone (the nvidia-cuda-nvrtc wheel) compiles these files.
#pragma once

typedef unsigned char sdc_u8;
typedef unsigned short sdc_u16;
typedef unsigned int sdc_u32;
typedef unsigned long long sdc_u64;

#ifndef SDC_HOST
// The SM this thread runs on: recorded per block so a wrong output element names its SM.
__device__ __forceinline__ sdc_u32 sdc_smid() {
    sdc_u32 id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    return id;
}

// Round-to-nearest-even conversions, as the hardware's cvt instructions do them.
__device__ __forceinline__ sdc_u16 sdc_f32_to_f16_rn(float x) {
    sdc_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ sdc_u16 sdc_f32_to_bf16_rn(float x) {
    sdc_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ sdc_u32 sdc_f32_to_tf32(float x) {
    sdc_u32 t;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(t) : "f"(x));
    return t;
}

// Warp-wide tensor-core products, D = A*B + C with f32 accumulators, in the PTX ISA's fragment layouts
// (groupID g = lane / 4, t = lane % 4):
//   m16n8k16 f16/bf16: a[0]=A[g][2t..2t+1] a[1]=A[g+8][2t..] a[2]=A[g][2t+8..] a[3]=A[g+8][2t+8..]
//                      b[0]=B[2t..2t+1][g] b[1]=B[2t+8..2t+9][g]        (lower index in the lower 16 bits)
//   m16n8k8 tf32:      a[0]=A[g][t] a[1]=A[g+8][t] a[2]=A[g][t+4] a[3]=A[g+8][t+4]; b[0]=B[t][g] b[1]=B[t+4][g]
//   m16n8k32 e4m3:     a[0]=A[g][4t..4t+3] a[1]=A[g+8][4t..] a[2]=A[g][4t+16..] a[3]=A[g+8][4t+16..]
//                      b[0]=B[4t..4t+3][g] b[1]=B[4t+16..4t+19][g]       (lowest index in the lowest byte)
//   c (all):           c[0]=C[g][2t] c[1]=C[g][2t+1] c[2]=C[g+8][2t] c[3]=C[g+8][2t+1]
__device__ __forceinline__ void sdc_mma_f16(float* c, const sdc_u32* a, const sdc_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void sdc_mma_bf16(float* c, const sdc_u32* a, const sdc_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#if __CUDA_ARCH__ >= 890
__device__ __forceinline__ void sdc_mma_fp8(float* c, const sdc_u32* a, const sdc_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
__device__ __forceinline__ void sdc_mma_tf32(float* c, const sdc_u32* a, const sdc_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Thread 0 of every block writes its SM id into smids[linear block index].
__device__ __forceinline__ void sdc_record_sm(sdc_u32* smids) {
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        smids[blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)] = sdc_smid();
    }
}
