// tensorlogic generated: row sum float32
__device__ __forceinline__ float tl_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short tl_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
extern "C" __global__ void row_sum_exp_f32(
    float* __restrict__ out, const float* __restrict__ in0) {
  __shared__ float smem[2];
  for (unsigned int row = blockIdx.x; row < 8u; row += gridDim.x) {
    const unsigned int off1 = row * 256u;
    float acc2 = __int_as_float(0x00000000);
    for (unsigned int r = threadIdx.x; r < 256u; r += 64u) {
      const unsigned int off3 = r;
      const float x4 = in0[(off1 + off3)];
      const float t5 = exp(x4);
      acc2 = (acc2 + t5);
    }
    for (int m = 16; m > 0; m >>= 1) acc2 = (acc2 + __shfl_xor_sync(0xffffffffu, acc2, m));
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = acc2;
    __syncthreads();
    acc2 = smem[0];
    for (int w = 1; w < 2; ++w) acc2 = (acc2 + smem[w]);
    __syncthreads();
    if (threadIdx.x == 0) out[row] = ((float)acc2);
  }
}
