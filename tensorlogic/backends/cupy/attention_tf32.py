"""CUDA C of the attention op's float32 tensor-core path: flash attention on TF32 MMAs (sm_80+).

The structure of ``attention_mma`` (FlashAttention-2 forward: a block of warps owns query rows of
one batch index, key and value tiles stream through shared memory two stages deep with
``cp.async``, online softmax in the base-2 domain on the accumulator fragments), with float32
operands on ``mma.sync.m16n8k8`` TF32 instructions.

Precision: TF32 keeps 10 of float32's 23 mantissa bits, so by default every operand ``x`` is
split into ``big = tf32(x)`` and ``small = tf32(x - big)`` and each product is taken as
``big*big + big*small + small*big`` (three MMAs; the dropped ``small*small`` is below 2^-21 of
the product): float32-level error at tensor-core speed, the split torch's memory-efficient
attention uses for float32 (CUTLASS's ``OpMultiplyAddFastF32``). ``split=False`` (the plan's
``matmul_precision="tf32"``) takes one MMA on the rounded operands, TF32's error.

Fragments: each lane reads its own 32-bit elements from shared memory (no ``ldmatrix``, which
moves 16-bit elements); rows are padded by 4 floats, so the eight rows of a fragment fall in
different banks. The score accumulators of an 8-key tile feed ``P V`` directly as A fragments
with the keys of the tile permuted (lane quad column ``t`` holds keys ``2t`` and ``2t + 1``;
the value fragments read the same two keys), so probabilities never touch shared memory. Each
tile's ``P V`` is summed by the tensor cores from zero and added to the float32 output with an
FMA (the tensor cores' own accumulation rounds less exactly; over the whole sequence its error
grew with S). The output leaves as 8-byte pairs straight to device memory.

Causal masks, paired blocks, the additive mask and the layouts (``inner``) work as in
``attention_mma``. Scratch: shared memory only.

Limits: head dims multiples of 8 up to 128, 16-byte aligned rows (``attention_gpu`` otherwise
uses the FFMA kernel of ``attention_c``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import BackendError
from .attention_mma import ASYNC_COPY_HELPERS, grid_x  # noqa: F401 - grid_x: this module's too

MAX_HEAD_DIM = 128

_HELPERS = r"""
__device__ __forceinline__ float tl_tf_ex2(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ unsigned tl_tf_round(float x) {
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }
// x = big + small, both TF32 (small rounds x - big, which is exact in float32)
__device__ __forceinline__ void tl_tf_split(float x, unsigned& big, unsigned& small) {
  big = tl_tf_round(x); small = tl_tf_round(x - __uint_as_float(big)); }
__device__ __forceinline__ void tl_tf_mma(float* c, const unsigned* a, unsigned b0,
                                          unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1)); }
"""


def supports(d: int, dv: int, dtype: str) -> bool:
    """Whether the TF32 kernel takes these head dims and dtype."""
    return dtype == "float32" and all(x % 8 == 0 and 8 <= x <= MAX_HEAD_DIM for x in (d, dv))


@dataclass(frozen=True)
class Config:
    """The block shape of one kernel.

    Args:
        warps: warps per block (4 or 8).
        mt: 16-row m-tiles per warp (1 or 2): with 2, each key and value fragment (and its
            split) feeds twice the MMAs.
        q_in_regs: keep the (split) query fragments in registers for the whole kernel, else
            each is read from shared memory and split per use (fewer registers).
        bn: keys per tile (32 or 64).
        pair: causal only: a block runs query block ``i`` and then ``n - 1 - i``.
    """

    warps: int = 4
    mt: int = 1
    q_in_regs: bool = False
    bn: int = 64
    pair: bool = False

    @property
    def rows(self) -> int:
        return 16 * self.mt * self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps


def shared_bytes(d: int, dv: int, cfg: Config) -> int:
    """Dynamic shared memory of one block: the query tile, two key and two value tiles, rows
    padded by 4 floats."""
    return 4 * (cfg.rows * (d + 4) + 2 * cfg.bn * (d + 4) + 2 * cfg.bn * (dv + 4))


def render(
    name: str,
    d: int,
    dv: int,
    causal: bool,
    has_mask: bool,
    cfg: Config = Config(),
    split: bool = True,
    helpers: bool = True,
    inner: tuple[int, int, int, int] = (1, 1, 1, 1),
) -> str:
    """The kernel ``name`` with the FFMA kernel's float32 signature; grid (``grid_x``, batch
    indices), ``cfg.threads`` threads, dynamic shared memory ``shared_bytes``. ``split``: three
    MMAs per product (float32 accuracy) instead of one (TF32). ``helpers=False`` leaves out the
    device functions (to put several kernels in one source)."""
    if not supports(d, dv, "float32"):
        raise BackendError(
            f"TF32 attention: head dims {d}/{dv}; it takes float32 and head dims that are "
            f"multiples of 8 up to {MAX_HEAD_DIM}"
        )
    if len(inner) != 4 or not all(isinstance(x, int) and x >= 1 for x in inner):
        raise BackendError(
            f"attention kernel: inner batch counts must be four positive ints, got {inner!r}"
        )
    if cfg.warps not in (4, 8) or cfg.mt not in (1, 2) or cfg.bn not in (32, 64):
        raise BackendError(
            f"TF32 attention: 4 or 8 warps of 1 or 2 m-tiles, 32 or 64 keys a tile, not {cfg}"
        )
    pair = causal and cfg.pair
    # registers a thread holds across a tile: output and score accumulators, query fragments
    held = cfg.mt * (dv // 2 + cfg.bn // 2 + ((d if split else d // 2) if cfg.q_in_regs else 0))
    min_blocks = max(1, (512 if held <= 80 else 256) // cfg.threads)
    flags = (
        f"causal={int(causal)} mask={int(has_mask)} warps={cfg.warps} mt={cfg.mt} "
        f"qregs={int(cfg.q_in_regs)} bn={cfg.bn} pair={int(pair)} split={int(split)} "
        f"inner={','.join(map(str, inner))}"
    )
    return f"""// tensorlogic generated: attention tf32 float32 d={d} dv={dv} {flags}
{ASYNC_COPY_HELPERS + _HELPERS if helpers else ""}
extern "C" __global__ void __launch_bounds__({cfg.threads}, {min_blocks}) {name}(
    float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ k,
    const float* __restrict__ v, const float* __restrict__ mask,
    const long long* __restrict__ moff, int sq, int sk, long long msq, long long msk,
    float scale, int batch0)
{{
  constexpr int WARPS = {cfg.warps}, MT = {cfg.mt}, THREADS = 32 * WARPS, BM = 16 * MT * WARPS;
  constexpr int BN = {cfg.bn}, D = {d}, DV = {dv}, WR = 16 * MT;
  constexpr int QS = D + 4, KS = D + 4, VS = DV + 4;
  constexpr int KD = D / 8, NT = BN / 8, NO = DV / 8;
  constexpr bool CAUSAL = {str(causal).lower()}, HAS_MASK = {str(has_mask).lower()};
  constexpr bool QREGS = {str(cfg.q_in_regs).lower()}, PAIR = {str(pair).lower()};
  constexpr bool SPLIT = {str(split).lower()};
  constexpr int QP = SPLIT ? 2 : 1;  // parts of a split operand: big (and small)
  constexpr int QIN = {inner[0]}, KIN = {inner[1]}, VIN = {inner[2]}, OIN = {inner[3]};
  constexpr long long QRS = (long long)QIN * D, KRS = (long long)KIN * D;
  constexpr long long VRS = (long long)VIN * DV, ORS = (long long)OIN * DV;
  extern __shared__ __align__(16) unsigned char tl_smem[];
  float* Qs = (float*)tl_smem;
  float* Ks = Qs + BM * QS;      // two stages
  float* Vs = Ks + 2 * BN * KS;  // two stages
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const long long b = (long long)blockIdx.y + batch0;
  const float* kb = k + (b / KIN) * sk * KRS + (b % KIN) * D;
  const float* vb = v + (b / VIN) * sk * VRS + (b % VIN) * DV;
  const float NEG_INF = __int_as_float(0xff800000);
  const float LOG2E = 1.4426950408889634f;
  const float sl2 = scale * LOG2E;
  const int nq = (sq + BM - 1) / BM;
  const float* wq = Qs + warp * WR * QS;  // this warp's rows of the query tile

  for (int pass = 0; pass < (PAIR ? 2 : 1); ++pass) {{
  const int qblk = PAIR ? (pass == 0 ? nq - 1 - (int)blockIdx.x : (int)blockIdx.x)
                        : (CAUSAL ? nq - 1 - (int)blockIdx.x : (int)blockIdx.x);
  if (PAIR && pass == 1 && qblk >= nq - 1 - (int)blockIdx.x) break;  // the middle block
  const int q0 = qblk * BM;
  const float* qb = q + (b / QIN) * sq * QRS + (b % QIN) * D + (long long)q0 * QRS;
  const int kend = (CAUSAL && q0 + BM < sk) ? q0 + BM : sk;
  const int ntiles = (kend + BN - 1) / BN;
  __syncthreads();  // the previous pass is done with the query tile

  for (int c = tid; c < BM * (D / 4); c += THREADS) {{
    const int r = c / (D / 4), cc = (c - r * (D / 4)) * 4;
    const bool in = q0 + r < sq;
    tl_att_cp16(tl_att_smem(Qs + r * QS + cc), qb + (long long)(in ? r : 0) * QRS + cc, in);
  }}
  auto load_tile = [&](int t) {{
    const int n0 = t * BN;
    float* kd = Ks + (t & 1) * BN * KS;
    float* vd = Vs + (t & 1) * BN * VS;
    for (int c = tid; c < BN * (D / 4); c += THREADS) {{
      const int r = c / (D / 4), cc = (c - r * (D / 4)) * 4;
      const bool in = n0 + r < sk;
      tl_att_cp16(tl_att_smem(kd + r * KS + cc), kb + (long long)(in ? n0 + r : 0) * KRS + cc, in);
    }}
    for (int c = tid; c < BN * (DV / 4); c += THREADS) {{
      const int r = c / (DV / 4), cc = (c - r * (DV / 4)) * 4;
      const bool in = n0 + r < sk;
      tl_att_cp16(tl_att_smem(vd + r * VS + cc), vb + (long long)(in ? n0 + r : 0) * VRS + cc,
                 in);
    }}
  }};
  if (ntiles > 0) load_tile(0);
  tl_att_commit();  // group 0: the query tile and tile 0

  // query A fragments: [m-tile][k step][part][4]; part 0 big, 1 small
  unsigned qa[QREGS ? MT : 1][QREGS ? KD : 1][QP][4];
  float o[MT][NO][4], m[MT][2], l[MT][2];  // m in log2 units; l: the lane's partial sums
#pragma unroll
  for (int i = 0; i < MT; ++i) {{
    m[i][0] = m[i][1] = NEG_INF; l[i][0] = l[i][1] = 0.f;
#pragma unroll
    for (int j = 0; j < NO; ++j) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
  }}
  const int wr0 = q0 + warp * WR;
  // the A fragment of m-tile i, k step kk from the query tile (rows g, g + 8; columns t4, t4 + 4)
  auto load_q = [&](unsigned (*dst)[4], int i, int kk) {{
    const float* p = wq + (i * 16 + g) * QS + kk * 8 + t4;
    const float x[4] = {{p[0], p[8 * QS], p[4], p[8 * QS + 4]}};
#pragma unroll
    for (int e = 0; e < 4; ++e) {{
      if (SPLIT) tl_tf_split(x[e], dst[0][e], dst[QP - 1][e]);
      else dst[0][e] = tl_tf_round(x[e]);
    }}
  }};

  for (int t = 0; t < ntiles; ++t) {{
    if (t + 1 < ntiles) load_tile(t + 1);
    tl_att_commit();   // one group per iteration, empty at the end, so wait_group 1 is tile t
    tl_att_wait1();
    __syncthreads();
    if (QREGS && t == 0) {{
#pragma unroll
      for (int i = 0; i < (QREGS ? MT : 0); ++i)
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) load_q(qa[QREGS ? i : 0][QREGS ? kk : 0], i, kk);
    }}
    const int n0 = t * BN;
    if (!CAUSAL || n0 <= wr0 + WR - 1) {{
      const float* kt = Ks + (t & 1) * BN * KS;
      const float* vt = Vs + (t & 1) * BN * VS;
      float s[MT][NT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {{
        unsigned qf[QREGS ? 1 : MT][QP][4];
        if (!QREGS) {{
#pragma unroll
          for (int i = 0; i < (QREGS ? 0 : MT); ++i) load_q(qf[i], i, kk);
        }}
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
          // B fragment: key j * 8 + g, dims kk * 8 + t4 and + 4
          const float* p = kt + (j * 8 + g) * KS + kk * 8 + t4;
          unsigned kf[QP][2];
          if (SPLIT) {{
            tl_tf_split(p[0], kf[0][0], kf[QP - 1][0]);
            tl_tf_split(p[4], kf[0][1], kf[QP - 1][1]);
          }} else {{
            kf[0][0] = tl_tf_round(p[0]); kf[0][1] = tl_tf_round(p[4]);
          }}
#pragma unroll
          for (int i = 0; i < MT; ++i) {{
            const unsigned (*a)[4] =
                QREGS ? qa[QREGS ? i : 0][QREGS ? kk : 0] : qf[QREGS ? 0 : i];
            if (SPLIT) {{
              tl_tf_mma(s[i][j], a[QP - 1], kf[0][0], kf[0][1]);
              tl_tf_mma(s[i][j], a[0], kf[QP - 1][0], kf[QP - 1][1]);
            }}
            tl_tf_mma(s[i][j], a[0], kf[0][0], kf[0][1]);
          }}
        }}
      }}
      const bool masked = HAS_MASK || n0 + BN > sk || (CAUSAL && n0 + BN - 1 > wr0);
      float al[MT][2];  // the factors that rescale the output rows to the new maxima
#pragma unroll
      for (int i = 0; i < MT; ++i) {{
        const int row0 = wr0 + i * 16 + g, row1 = row0 + 8;
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
#pragma unroll
          for (int e = 0; e < 4; ++e) {{
            float x = s[i][j][e] * sl2;
            if (masked) {{
              const int row = e < 2 ? row0 : row1;
              const int col = n0 + j * 8 + 2 * t4 + (e & 1);
              if (HAS_MASK && row < sq && col < sk)
                x += LOG2E * mask[moff[b] + (long long)row * msq + (long long)col * msk];
              if (col >= sk || (CAUSAL && col > row)) x = NEG_INF;
            }}
            s[i][j][e] = x;
          }}
          mx0 = fmaxf(mx0, fmaxf(s[i][j][0], s[i][j][1]));
          mx1 = fmaxf(mx1, fmaxf(s[i][j][2], s[i][j][3]));
        }}
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {{
          mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
          mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }}
        const float mn0 = fmaxf(m[i][0], mx0), mn1 = fmaxf(m[i][1], mx1);
        // a row with every key hidden so far shifts by 0: 2^-inf = 0, never NaN
        const float sh0 = (mn0 == NEG_INF) ? 0.f : mn0, sh1 = (mn1 == NEG_INF) ? 0.f : mn1;
        al[i][0] = tl_tf_ex2(m[i][0] - sh0); al[i][1] = tl_tf_ex2(m[i][1] - sh1);
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
          s[i][j][0] = tl_tf_ex2(s[i][j][0] - sh0); s[i][j][1] = tl_tf_ex2(s[i][j][1] - sh0);
          s[i][j][2] = tl_tf_ex2(s[i][j][2] - sh1); s[i][j][3] = tl_tf_ex2(s[i][j][3] - sh1);
          rs0 += s[i][j][0] + s[i][j][1]; rs1 += s[i][j][2] + s[i][j][3];
        }}
        l[i][0] = l[i][0] * al[i][0] + rs0; l[i][1] = l[i][1] * al[i][1] + rs1;
        m[i][0] = mn0; m[i][1] = mn1;
      }}
      // P V: the lane's scores of an 8-key tile (keys 2 t4, 2 t4 + 1 of rows g and g + 8) are
      // the A fragment of an MMA whose k index t4 is key 2 t4 and t4 + 4 key 2 t4 + 1
      unsigned pa[MT][NT][QP][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
          const float x[4] = {{s[i][j][0], s[i][j][2], s[i][j][1], s[i][j][3]}};
#pragma unroll
          for (int e = 0; e < 4; ++e) {{
            if (SPLIT) tl_tf_split(x[e], pa[i][j][0][e], pa[i][j][QP - 1][e]);
            else pa[i][j][0][e] = tl_tf_round(x[e]);
          }}
        }}
      // each 8-column block of the tile's P V is summed from zero and added to the output
      // with a float32 FMA: the tensor cores' accumulation runs over one tile, never over
      // the whole sequence (its rounding would pile up with S)
      const float* p = vt + 2 * t4 * VS + g;
#pragma unroll
      for (int n = 0; n < NO; ++n) {{
        float acc[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
          const float* pv = p + j * 8 * VS + n * 8;
          unsigned vf[QP][2];
          if (SPLIT) {{
            tl_tf_split(pv[0], vf[0][0], vf[QP - 1][0]);
            tl_tf_split(pv[VS], vf[0][1], vf[QP - 1][1]);
          }} else {{
            vf[0][0] = tl_tf_round(pv[0]); vf[0][1] = tl_tf_round(pv[VS]);
          }}
#pragma unroll
          for (int i = 0; i < MT; ++i) {{
            if (SPLIT) {{
              tl_tf_mma(acc[i], pa[i][j][QP - 1], vf[0][0], vf[0][1]);
              tl_tf_mma(acc[i], pa[i][j][0], vf[QP - 1][0], vf[QP - 1][1]);
            }}
            tl_tf_mma(acc[i], pa[i][j][0], vf[0][0], vf[0][1]);
          }}
        }}
#pragma unroll
        for (int i = 0; i < MT; ++i) {{
          o[i][n][0] = fmaf(o[i][n][0], al[i][0], acc[i][0]);
          o[i][n][1] = fmaf(o[i][n][1], al[i][0], acc[i][1]);
          o[i][n][2] = fmaf(o[i][n][2], al[i][1], acc[i][2]);
          o[i][n][3] = fmaf(o[i][n][3], al[i][1], acc[i][3]);
        }}
      }}
    }}
    __syncthreads();  // every warp is done with stage t & 1 before tile t + 2 goes there
  }}
  tl_att_wait0();
  float* ob = out + (b / OIN) * sq * ORS + (b % OIN) * DV;
#pragma unroll
  for (int i = 0; i < MT; ++i) {{
    float l0 = l[i][0], l1 = l[i][1];
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {{
      l0 += __shfl_xor_sync(0xffffffffu, l0, off);
      l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }}
    // l == 0 (every key hidden) gives 0 * inf = NaN, as the softmax of an all -inf row
    const float i0 = 1.f / l0, i1 = 1.f / l1;
    const int row0 = wr0 + i * 16 + g, row1 = row0 + 8;
#pragma unroll
    for (int j = 0; j < NO; ++j) {{
      if (row0 < sq)
        *(float2*)(ob + (long long)row0 * ORS + j * 8 + 2 * t4) =
            make_float2(o[i][j][0] * i0, o[i][j][1] * i0);
      if (row1 < sq)
        *(float2*)(ob + (long long)row1 * ORS + j * 8 + 2 * t4) =
            make_float2(o[i][j][2] * i1, o[i][j][3] * i1);
    }}
  }}
  }}  // pass
}}
"""
