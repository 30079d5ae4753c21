"""CUDA C of the attention op's tensor-core path: float16 flash attention on ``mma.sync`` (sm_80+).

Four warps own 16 query rows each of a 64-row block; the key and value tiles (64 keys) are
copied to shared memory with 16-byte loads. Per tile each warp computes its 16 x 64 scores with
``mma.sync.m16n8k16`` (float16 inputs, float32 accumulation; the query fragments stay in
registers for the whole kernel), applies scale, mask and causal limits, and runs the online
softmax on the accumulator fragments (a row's values live in the 4 lanes of a quad: two
shuffles reduce them). The probabilities are rounded to float16 and reused as the A fragments
of ``P V`` without touching shared memory, as FlashAttention-2 does; the output accumulates in
float32 and is rounded once.

Limits: head dims ``D`` a multiple of 16 and ``Dv`` a multiple of 8, both at most 128, and
16-byte aligned rows (``attention_gpu`` checks and otherwise uses the FFMA kernel). bfloat16 is
the same kernel with ``.bf16`` in the mma and the conversions.
"""

from __future__ import annotations

from ...errors import BackendError

THREADS = 128
BM = 64
BN = 64
MAX_HEAD_DIM = 128

_HELPERS = r"""
__device__ __forceinline__ float tl_half_to_float(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned tl_pack_h2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
__device__ __forceinline__ void tl_mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)); }
"""


def supports(d: int, dv: int, dtype: str) -> bool:
    """Whether the tensor-core kernel takes these head dims and dtype."""
    return dtype == "float16" and d % 16 == 0 and dv % 8 == 0 and 16 <= d <= MAX_HEAD_DIM \
        and 8 <= dv <= MAX_HEAD_DIM


def shared_bytes(d: int, dv: int) -> int:
    """Dynamic shared memory of one block: query, key and value tiles, rows padded by 8."""
    return 2 * (BM * (d + 8) + BN * (d + 8) + BN * (dv + 8))


def render(name: str, d: int, dv: int, causal: bool, has_mask: bool, helpers: bool = True) -> str:
    """The kernel ``name`` with the FFMA kernel's signature (float16 pointers, float scale);
    grid (query blocks of 64, batch indices), 128 threads, dynamic shared ``shared_bytes``."""
    if not supports(d, dv, "float16"):
        raise BackendError(f"tensor-core attention: head dims {d}/{dv} must be multiples of "
                           f"16/8 and at most {MAX_HEAD_DIM}")
    flags = f"causal={int(causal)} mask={int(has_mask)}"
    return f"""// tensorlogic generated: attention mma float16 d={d} dv={dv} {flags}
{_HELPERS if helpers else ""}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
    unsigned short* __restrict__ out, const unsigned short* __restrict__ q,
    const unsigned short* __restrict__ k, const unsigned short* __restrict__ v,
    const unsigned short* __restrict__ mask, const long long* __restrict__ moff,
    int sq, int sk, long long msq, long long msk, float scale, int batch0)
{{
  constexpr int BM = {BM}, BN = {BN}, D = {d}, DV = {dv};
  constexpr int QS = D + 8, KS = D + 8, VS = DV + 8, KD = D / 16, NT = BN / 8, NO = DV / 8;
  constexpr bool CAUSAL = {str(causal).lower()}, HAS_MASK = {str(has_mask).lower()};
  extern __shared__ __align__(16) unsigned char tl_smem[];
  unsigned short* Qs = (unsigned short*)tl_smem;
  unsigned short* Ks = Qs + BM * QS;
  unsigned short* Vs = Ks + BN * KS;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int qblk = CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qblk * BM;
  const long long b = (long long)blockIdx.y + batch0;
  const unsigned short* qb = q + (b * sq + q0) * D;
  const unsigned short* kb = k + b * sk * D;
  const unsigned short* vb = v + b * sk * DV;
  const float NEG_INF = __int_as_float(0xff800000);
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  for (int c = tid; c < BM * (D / 8); c += {THREADS}) {{
    const int r = c / (D / 8), cc = (c - r * (D / 8)) * 8;
    *(uint4*)(Qs + r * QS + cc) =
        (q0 + r < sq) ? *(const uint4*)(qb + (long long)r * D + cc) : zero4;
  }}
  __syncthreads();
  unsigned qa[KD][4];
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {{
    const unsigned short* base = Qs + (warp * 16) * QS + kk * 16 + 2 * t4;
    qa[kk][0] = *(const unsigned*)(base + g * QS);
    qa[kk][1] = *(const unsigned*)(base + (g + 8) * QS);
    qa[kk][2] = *(const unsigned*)(base + g * QS + 8);
    qa[kk][3] = *(const unsigned*)(base + (g + 8) * QS + 8);
  }}
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;
  const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
  const int kend = (CAUSAL && q0 + BM < sk) ? q0 + BM : sk;
  for (int n0 = 0; n0 < kend; n0 += BN) {{
    __syncthreads();  // every warp is done with the previous tiles
    for (int c = tid; c < BN * (D / 8); c += {THREADS}) {{
      const int r = c / (D / 8), cc = (c - r * (D / 8)) * 8;
      *(uint4*)(Ks + r * KS + cc) =
          (n0 + r < sk) ? *(const uint4*)(kb + (long long)(n0 + r) * D + cc) : zero4;
    }}
    for (int c = tid; c < BN * (DV / 8); c += {THREADS}) {{
      const int r = c / (DV / 8), cc = (c - r * (DV / 8)) * 8;
      *(uint4*)(Vs + r * VS + cc) =
          (n0 + r < sk) ? *(const uint4*)(vb + (long long)(n0 + r) * DV + cc) : zero4;
    }}
    __syncthreads();
    float s[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {{
#pragma unroll
      for (int j = 0; j < NT; ++j) {{
        const unsigned short* kp = Ks + (j * 8 + g) * KS + kk * 16 + 2 * t4;
        tl_mma_f16(s[j], qa[kk], *(const unsigned*)kp, *(const unsigned*)(kp + 8));
      }}
    }}
    float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
    for (int j = 0; j < NT; ++j) {{
#pragma unroll
      for (int e = 0; e < 4; ++e) {{
        const int row = e < 2 ? row0 : row1;
        const int col = n0 + j * 8 + 2 * t4 + (e & 1);
        float x = s[j][e] * scale;
        if (HAS_MASK && row < sq && col < sk)
          x += tl_half_to_float(mask[moff[b] + (long long)row * msq + (long long)col * msk]);
        if (col >= sk || (CAUSAL && col > row)) x = NEG_INF;
        s[j][e] = x;
      }}
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }}
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {{
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }}
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // a row with every key hidden so far shifts by 0: exp(-inf) = 0, never NaN
    const float sh0 = (mn0 == NEG_INF) ? 0.f : mn0, sh1 = (mn1 == NEG_INF) ? 0.f : mn1;
    const float al0 = expf(m0 - sh0), al1 = expf(m1 - sh1);
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int j = 0; j < NT; ++j) {{
      s[j][0] = expf(s[j][0] - sh0); s[j][1] = expf(s[j][1] - sh0);
      s[j][2] = expf(s[j][2] - sh1); s[j][3] = expf(s[j][3] - sh1);
      rs0 += s[j][0] + s[j][1]; rs1 += s[j][2] + s[j][3];
    }}
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {{
      rs0 += __shfl_xor_sync(0xffffffffu, rs0, off);
      rs1 += __shfl_xor_sync(0xffffffffu, rs1, off);
    }}
    l0 = l0 * al0 + rs0; l1 = l1 * al1 + rs1;
    m0 = mn0; m1 = mn1;
#pragma unroll
    for (int j = 0; j < NO; ++j) {{
      o[j][0] *= al0; o[j][1] *= al0; o[j][2] *= al1; o[j][3] *= al1;
    }}
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {{
      unsigned pa[4];
      pa[0] = tl_pack_h2(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = tl_pack_h2(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = tl_pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = tl_pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < NO; ++j) {{
        const unsigned short* vp = Vs + (kk * 16 + 2 * t4) * VS + j * 8 + g;
        const unsigned b0 = (unsigned)vp[0] | ((unsigned)vp[VS] << 16);
        const unsigned b1 = (unsigned)vp[8 * VS] | ((unsigned)vp[9 * VS] << 16);
        tl_mma_f16(o[j], pa, b0, b1);
      }}
    }}
  }}
  // l == 0 (every key hidden) gives 0/0 = NaN, as the softmax of an all -inf row
#pragma unroll
  for (int j = 0; j < NO; ++j) {{
    const int col = j * 8 + 2 * t4;
    if (row0 < sq)
      *(unsigned*)(out + (b * sq + row0) * DV + col) = tl_pack_h2(o[j][0] / l0, o[j][1] / l0);
    if (row1 < sq)
      *(unsigned*)(out + (b * sq + row1) * DV + col) = tl_pack_h2(o[j][2] / l1, o[j][3] / l1);
  }}
}}
"""
