"""CUDA C of the attention op's tensor-core path: bfloat16/float16 flash attention (sm_80+).

The FlashAttention-2 forward structure. A block of ``WARPS`` warps owns ``16 * WARPS`` query rows
of one batch index, 16 rows per warp; the key and value tiles (64 keys) stream through shared
memory two stages deep with ``cp.async`` (tile t + 1 is in flight while tile t is used), in rows
padded by 16 bytes so the ``ldmatrix`` reads of eight rows hit eight different bank groups.

Per tile each warp computes its 16 x 64 scores with ``mma.sync.m16n8k16`` (16-bit inputs, float32
accumulation; the query fragments stay in registers for the whole kernel, loaded once with
``ldmatrix``) and runs the online softmax on the accumulator fragments in the base-2 domain: the
scale is folded into ``log2(e)``, so each probability is one multiply and one ``ex2``. A row's
values live in the 4 lanes of a quad (two shuffles give its maximum; the sum is reduced once at
the end). The probabilities are rounded to 16 bits and reused as the A fragments of ``P V``
without touching shared memory; the value B fragments come from ``ldmatrix.trans``. The output
accumulates in float32, is rounded once and leaves through shared memory as 16-byte rows.

Causal: a block stops after the diagonal; a warp skips the tiles wholly right of its rows and
masks only the tiles its diagonal crosses. The additive mask is read element-wise where given.
Scratch: shared memory only (O(rows * head dim) per block), nothing in device memory.

Limits: head dims ``D`` and ``Dv`` multiples of 16, at most 128, 16-byte aligned rows
(``attention_gpu`` checks and otherwise uses the exact FFMA kernel of ``attention_c``).
"""

from __future__ import annotations

from ...errors import BackendError

BN = 64
MAX_HEAD_DIM = 128
DTYPES = {"float16": "f16", "bfloat16": "bf16"}

_HELPERS = r"""
__device__ __forceinline__ unsigned tl_att_smem(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r; }
__device__ __forceinline__ void tl_att_cp16(unsigned dst, const void* src, bool full) {
  // 16 bytes, or 16 zero bytes where the row is past the end (src-size 0 reads nothing)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :: "r"(dst), "l"(src), "r"(full ? 16 : 0) : "memory"); }
__device__ __forceinline__ void tl_att_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void tl_att_wait1() {
  asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void tl_att_wait0() {
  asm volatile("cp.async.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void tl_att_ldm(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory"); }
__device__ __forceinline__ void tl_att_ldm_t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory"); }
__device__ __forceinline__ float tl_att_ex2(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float tl_att_f16_f32(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ float tl_att_bf16_f32(unsigned short h) {
  float f; asm("cvt.f32.bf16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned tl_att_pack_f16(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
__device__ __forceinline__ unsigned tl_att_pack_bf16(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
__device__ __forceinline__ void tl_att_mma_f16(float* c, const unsigned* a, unsigned b0,
                                               unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)); }
__device__ __forceinline__ void tl_att_mma_bf16(float* c, const unsigned* a, unsigned b0,
                                                unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)); }
"""


def supports(d: int, dv: int, dtype: str) -> bool:
    """Whether the tensor-core kernel takes these head dims and dtype."""
    return dtype in DTYPES and all(x % 16 == 0 and 16 <= x <= MAX_HEAD_DIM for x in (d, dv))


def rows(warps: int) -> int:
    """Query rows of one block."""
    return 16 * warps


def threads(warps: int) -> int:
    return 32 * warps


def shared_bytes(d: int, dv: int, warps: int) -> int:
    """Dynamic shared memory of one block: the query (then output) tile, two key and two value
    tiles, rows padded by 8 elements (16 bytes)."""
    return 2 * (rows(warps) * (max(d, dv) + 8) + 2 * BN * (d + 8) + 2 * BN * (dv + 8))


def render(name: str, d: int, dv: int, dtype: str, causal: bool, has_mask: bool,
           warps: int = 8, helpers: bool = True) -> str:
    """The kernel ``name`` with the FFMA kernel's signature (16-bit pointers, float scale); grid
    (query blocks of ``rows(warps)``, batch indices), ``threads(warps)`` threads, dynamic shared
    memory ``shared_bytes``. ``helpers=False`` leaves out the device functions (to put several
    kernels in one source)."""
    if not supports(d, dv, dtype):
        raise BackendError(f"tensor-core attention: {dtype} with head dims {d}/{dv}; it takes "
                           f"{sorted(DTYPES)} and head dims that are multiples of 16 up to "
                           f"{MAX_HEAD_DIM}")
    if warps not in (4, 8):
        raise BackendError(f"tensor-core attention: 4 or 8 warps per block, not {warps}")
    ty = DTYPES[dtype]
    # registers: small heads keep two blocks of 256 threads per multiprocessor
    min_blocks = (2 if max(d, dv) <= 64 else 1) * (8 // warps)
    flags = f"causal={int(causal)} mask={int(has_mask)} warps={warps}"
    return f"""// tensorlogic generated: attention mma {dtype} d={d} dv={dv} {flags}
{_HELPERS if helpers else ""}
extern "C" __global__ void __launch_bounds__({threads(warps)}, {min_blocks}) {name}(
    unsigned short* __restrict__ out, const unsigned short* __restrict__ q,
    const unsigned short* __restrict__ k, const unsigned short* __restrict__ v,
    const unsigned short* __restrict__ mask, const long long* __restrict__ moff,
    int sq, int sk, long long msq, long long msk, float scale, int batch0)
{{
  constexpr int WARPS = {warps}, THREADS = 32 * WARPS, BM = 16 * WARPS, BN = {BN};
  constexpr int D = {d}, DV = {dv};
  constexpr int KS = D + 8, VS = DV + 8, OS = (D > DV ? D : DV) + 8;
  constexpr int KD = D / 16, NT = BN / 8, NO = DV / 8;
  constexpr bool CAUSAL = {str(causal).lower()}, HAS_MASK = {str(has_mask).lower()};
  extern __shared__ __align__(16) unsigned char tl_smem[];
  unsigned short* Qs = (unsigned short*)tl_smem;  // the query tile, at the end the output tile
  unsigned short* Ks = Qs + BM * OS;             // two stages
  unsigned short* Vs = Ks + 2 * BN * KS;         // two stages
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // causal: the longest rows start first
  const int qblk = CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qblk * BM;
  const long long b = (long long)blockIdx.y + batch0;
  const unsigned short* qb = q + (b * sq + q0) * D;
  const unsigned short* kb = k + b * sk * D;
  const unsigned short* vb = v + b * sk * DV;
  const float NEG_INF = __int_as_float(0xff800000);
  const float LOG2E = 1.4426950408889634f;
  const float sl2 = scale * LOG2E;
  const int kend = (CAUSAL && q0 + BM < sk) ? q0 + BM : sk;
  const int ntiles = (kend + BN - 1) / BN;

  for (int c = tid; c < BM * (D / 8); c += THREADS) {{
    const int r = c / (D / 8), cc = (c - r * (D / 8)) * 8;
    const bool in = q0 + r < sq;
    tl_att_cp16(tl_att_smem(Qs + r * OS + cc), qb + (long long)(in ? r : 0) * D + cc, in);
  }}
  auto load_tile = [&](int t) {{
    const int n0 = t * BN;
    unsigned short* kd = Ks + (t & 1) * BN * KS;
    unsigned short* vd = Vs + (t & 1) * BN * VS;
    for (int c = tid; c < BN * (D / 8); c += THREADS) {{
      const int r = c / (D / 8), cc = (c - r * (D / 8)) * 8;
      const bool in = n0 + r < sk;
      tl_att_cp16(tl_att_smem(kd + r * KS + cc), kb + (long long)(in ? n0 + r : 0) * D + cc, in);
    }}
    for (int c = tid; c < BN * (DV / 8); c += THREADS) {{
      const int r = c / (DV / 8), cc = (c - r * (DV / 8)) * 8;
      const bool in = n0 + r < sk;
      tl_att_cp16(tl_att_smem(vd + r * VS + cc), vb + (long long)(in ? n0 + r : 0) * DV + cc,
                  in);
    }}
  }};
  if (ntiles > 0) load_tile(0);
  tl_att_commit();  // group 0: the query tile and tile 0

  unsigned qa[KD][4];
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.f, l1 = 0.f;  // m in log2 units
  const int wr0 = q0 + warp * 16, row0 = wr0 + g, row1 = row0 + 8;
  // the lane's ldmatrix row and column: matrices 0-3 are lanes 0-7, 8-15, 16-23, 24-31
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
  const int kr = (lane & 7) + (lane >> 4) * 8, kc = ((lane >> 3) & 1) * 8;

  for (int t = 0; t < ntiles; ++t) {{
    if (t + 1 < ntiles) load_tile(t + 1);
    tl_att_commit();   // one group per iteration, empty at the end, so wait_group 1 is tile t
    tl_att_wait1();
    __syncthreads();
    if (t == 0) {{
#pragma unroll
      for (int kk = 0; kk < KD; ++kk)
        tl_att_ldm(qa[kk], tl_att_smem(Qs + (warp * 16 + lr) * OS + kk * 16 + lc));
    }}
    const int n0 = t * BN;
    // causal: a tile wholly right of this warp's rows adds nothing
    if (!CAUSAL || n0 <= wr0 + 15) {{
      const unsigned short* kt = Ks + (t & 1) * BN * KS;
      const unsigned short* vt = Vs + (t & 1) * BN * VS;
      float s[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {{
#pragma unroll
        for (int jj = 0; jj < NT / 2; ++jj) {{
          unsigned kf[4];
          tl_att_ldm(kf, tl_att_smem(kt + (jj * 16 + kr) * KS + kk * 16 + kc));
          tl_att_mma_{ty}(s[2 * jj], qa[kk], kf[0], kf[1]);
          tl_att_mma_{ty}(s[2 * jj + 1], qa[kk], kf[2], kf[3]);
        }}
      }}
      // only the diagonal tiles of a causal mask, the last tile and a user's mask need masking
      const bool masked = HAS_MASK || n0 + BN > sk || (CAUSAL && n0 + BN - 1 > wr0);
      float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
      for (int j = 0; j < NT; ++j) {{
#pragma unroll
        for (int e = 0; e < 4; ++e) {{
          float x = s[j][e] * sl2;
          if (masked) {{
            const int row = e < 2 ? row0 : row1;
            const int col = n0 + j * 8 + 2 * t4 + (e & 1);
            if (HAS_MASK && row < sq && col < sk)
              x += LOG2E * tl_att_{ty}_f32(mask[moff[b] + (long long)row * msq
                                               + (long long)col * msk]);
            if (col >= sk || (CAUSAL && col > row)) x = NEG_INF;
          }}
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
      // a row with every key hidden so far shifts by 0: 2^-inf = 0, never NaN
      const float sh0 = (mn0 == NEG_INF) ? 0.f : mn0, sh1 = (mn1 == NEG_INF) ? 0.f : mn1;
      const float al0 = tl_att_ex2(m0 - sh0), al1 = tl_att_ex2(m1 - sh1);
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int j = 0; j < NT; ++j) {{
        s[j][0] = tl_att_ex2(s[j][0] - sh0); s[j][1] = tl_att_ex2(s[j][1] - sh0);
        s[j][2] = tl_att_ex2(s[j][2] - sh1); s[j][3] = tl_att_ex2(s[j][3] - sh1);
        rs0 += s[j][0] + s[j][1]; rs1 += s[j][2] + s[j][3];
      }}
      // the lane's partial sums: the quad shares the row maximum, so they add up at the end
      l0 = l0 * al0 + rs0; l1 = l1 * al1 + rs1;
      m0 = mn0; m1 = mn1;
#pragma unroll
      for (int j = 0; j < NO; ++j) {{
        o[j][0] *= al0; o[j][1] *= al0; o[j][2] *= al1; o[j][3] *= al1;
      }}
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {{
        unsigned pa[4];
        pa[0] = tl_att_pack_{ty}(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = tl_att_pack_{ty}(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = tl_att_pack_{ty}(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = tl_att_pack_{ty}(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int jj = 0; jj < NO / 2; ++jj) {{
          unsigned vf[4];
          tl_att_ldm_t(vf, tl_att_smem(vt + (kk * 16 + lr) * VS + jj * 16 + lc));
          tl_att_mma_{ty}(o[2 * jj], pa, vf[0], vf[1]);
          tl_att_mma_{ty}(o[2 * jj + 1], pa, vf[2], vf[3]);
        }}
      }}
    }}
    __syncthreads();  // every warp is done with stage t & 1 before tile t + 2 goes there
  }}
  tl_att_wait0();
  __syncthreads();  // no copy into the query tile is pending (a block with no key tiles)
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {{
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }}
  // l == 0 (every key hidden) gives 0 * inf = NaN, as the softmax of an all -inf row
  const float i0 = 1.f / l0, i1 = 1.f / l1;
  unsigned short* os = Qs + warp * 16 * OS;  // this warp's own rows of the query tile
#pragma unroll
  for (int j = 0; j < NO; ++j) {{
    *(unsigned*)(os + g * OS + j * 8 + 2 * t4) = tl_att_pack_{ty}(o[j][0] * i0, o[j][1] * i0);
    *(unsigned*)(os + (g + 8) * OS + j * 8 + 2 * t4) =
        tl_att_pack_{ty}(o[j][2] * i1, o[j][3] * i1);
  }}
  __syncwarp();
  for (int c = lane; c < 16 * (DV / 8); c += 32) {{
    const int r = c / (DV / 8), cc = (c - r * (DV / 8)) * 8;
    if (wr0 + r < sq)
      *(uint4*)(out + (b * sq + wr0 + r) * DV + cc) = *(const uint4*)(os + r * OS + cc);
  }}
}}
"""
