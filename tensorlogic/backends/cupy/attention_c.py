"""CUDA C of the attention op: one flash-attention kernel, exact FFMA arithmetic (no CuPy needed).

One thread block of 256 threads (16 x 16) owns ``BM = 16 * TM`` query rows of one batch index.
It keeps the scaled query tile in shared memory and walks the keys in tiles of ``BN = 16 * TN``:

1. the key tile goes to shared memory; each thread computes a TM x TN block of scores (rows
   ``rg + 16 i``, keys ``cg + 16 j``; row and key strides padded to odd lengths, so no bank
   conflicts), adds the mask, hides keys past the end or right of the diagonal (causal);
2. online softmax: the 16 threads of a row group share their row maxima and sums through warp
   shuffles; the accumulator is rescaled by ``exp(m_old - m_new)``;
3. the probabilities and then the value tile go to shared memory, and each thread adds
   ``P V`` into its TM x ceil(Dv / 16) accumulator.

Scores never leave the chip: the scratch is the block's shared memory, O(BM * (D + BN)).
Each tensor is addressed through its layout (``attention_gpu.layout_strides``): a batch index
splits into (outer, inner) and rows lie a row stride apart, so ``(B, S, H, D)`` tensors are
read and written in place.
float16 and bfloat16 loads and stores convert through inline PTX; arithmetic is float32 (float64
for float64 inputs) with ``expf``/``exp``, so results match the host kernel within float32
rounding.
"""

from __future__ import annotations

from ...errors import BackendError
from .cuda_c import HALF_CONV, HALF_PRELUDE

THREADS = 256
CTYPE = {
    "float32": "float",
    "float64": "double",
    "float16": "unsigned short",
    "bfloat16": "unsigned short",
}
COMPUTE = {"float32": "float", "float64": "double", "float16": "float", "bfloat16": "float"}
_CONV = HALF_CONV
MAX_HEAD_DIM = 256


def tiles(dtype: str) -> tuple[int, int]:
    """(TM, TN): rows and keys per thread; float64 uses half the tile (shared memory)."""
    return (2, 2) if dtype == "float64" else (4, 4)


def shared_bytes(d: int, dv: int, dtype: str) -> int:
    """Dynamic shared memory of one block: query tile, key/value tile, probability tile."""
    tm, tn = tiles(dtype)
    bm, bn = 16 * tm, 16 * tn
    size = 8 if dtype == "float64" else 4
    return size * (bm * (d + 1) + bn * (max(d, dv) + 1) + bm * (bn + 1))


def render(
    name: str,
    d: int,
    dv: int,
    dtype: str,
    causal: bool,
    has_mask: bool,
    inner: tuple[int, int, int, int] = (1, 1, 1, 1),
) -> str:
    """The kernel ``name``: ``(out, q, k, v, mask, mask_offsets, sq, sk, mask_row_stride,
    mask_col_stride, scale, batch0)``; ``inner``: the inner batch counts of q, k, v and out
    (their layout, ``attention_gpu.layout_strides``; all 1 for the canonical layout); grid
    (query blocks, batch indices), 256 threads, dynamic shared memory ``shared_bytes``."""
    if dtype not in CTYPE:
        raise BackendError(f"attention kernel: no GPU path for dtype {dtype}")
    if not (1 <= d <= MAX_HEAD_DIM and 1 <= dv <= MAX_HEAD_DIM):
        raise BackendError(
            f"attention kernel: head dims {d} and {dv} must lie in 1..{MAX_HEAD_DIM}"
        )
    tm, tn = tiles(dtype)
    t, c = CTYPE[dtype], COMPUTE[dtype]
    half = dtype in _CONV
    load = _CONV[dtype][0] if half else f"({c})"
    store = _CONV[dtype][1] if half else ""
    neg_inf = (
        "__longlong_as_double(0xfff0000000000000ULL)"
        if c == "double"
        else "__int_as_float(0xff800000)"
    )
    exp = "exp" if c == "double" else "expf"
    fma = "fma" if c == "double" else "fmaf"
    nj = -(-dv // 16)
    dmax = max(d, dv)
    if len(inner) != 4 or not all(isinstance(x, int) and x >= 1 for x in inner):
        raise BackendError(
            f"attention kernel: inner batch counts must be four positive ints, got {inner!r}"
        )
    flags = f"causal={int(causal)} mask={int(has_mask)} inner={','.join(map(str, inner))}"
    return f"""// tensorlogic generated: attention {dtype} d={d} dv={dv} {flags}
{HALF_PRELUDE if half else ""}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(
    {t}* __restrict__ out, const {t}* __restrict__ q, const {t}* __restrict__ k,
    const {t}* __restrict__ v, const {t}* __restrict__ mask, const long long* __restrict__ moff,
    int sq, int sk, long long msq, long long msk, {c} scale, int batch0)
{{
  typedef {t} T;
  typedef {c} C;
  constexpr int TM = {tm}, TN = {tn}, BM = 16 * TM, BN = 16 * TN, D = {d}, DV = {dv};
  constexpr int QS = D + 1, KS = {dmax} + 1, PS = BN + 1, NJ = {nj};
  constexpr bool CAUSAL = {str(causal).lower()}, HAS_MASK = {str(has_mask).lower()};
  // the layout: batch axes after the sequence axis (inner) and the row stride of each tensor
  constexpr int QIN = {inner[0]}, KIN = {inner[1]}, VIN = {inner[2]}, OIN = {inner[3]};
  constexpr long long QRS = (long long)QIN * D, KRS = (long long)KIN * D;
  constexpr long long VRS = (long long)VIN * DV, ORS = (long long)OIN * DV;
  extern __shared__ __align__(16) unsigned char tl_smem[];
  C* Qs = (C*)tl_smem;
  C* KVs = Qs + BM * QS;
  C* Ps = KVs + BN * KS;
  const int t = threadIdx.x, rg = t >> 4, cg = t & 15;
  const int qblk = CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int q0 = qblk * BM;
  const long long b = (long long)blockIdx.y + batch0;
  // the layout of each tensor: batch index b = (outer, inner), rows Xrs apart
  const T* qb = q + (b / QIN) * sq * QRS + (b % QIN) * D + (long long)q0 * QRS;
  const T* kb = k + (b / KIN) * sk * KRS + (b % KIN) * D;
  const T* vb = v + (b / VIN) * sk * VRS + (b % VIN) * DV;
  T* ob = out + (b / OIN) * sq * ORS + (b % OIN) * DV;
  const C NEG_INF = {neg_inf};
  for (int idx = t; idx < BM * D; idx += {THREADS}) {{
    const int m = idx / D, dd = idx - m * D;
    Qs[m * QS + dd] = (q0 + m < sq) ? {load}(qb[(long long)m * QRS + dd]) * scale : (C)0;
  }}
  C mi[TM], li[TM], o[TM][NJ];
#pragma unroll
  for (int i = 0; i < TM; ++i) {{
    mi[i] = NEG_INF; li[i] = (C)0;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) o[i][jj] = (C)0;
  }}
  const int kend = (CAUSAL && q0 + BM < sk) ? q0 + BM : sk;
  for (int n0 = 0; n0 < kend; n0 += BN) {{
    __syncthreads();  // the previous tile's readers are done with KVs and Ps
    for (int idx = t; idx < BN * D; idx += {THREADS}) {{
      const int n = idx / D, dd = idx - n * D;
      KVs[n * KS + dd] = (n0 + n < sk) ? {load}(kb[(long long)(n0 + n) * KRS + dd]) : (C)0;
    }}
    __syncthreads();
    C s[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) s[i][j] = (C)0;
#pragma unroll 4
    for (int dd = 0; dd < D; ++dd) {{
      C a[TM], bk[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = Qs[(rg + 16 * i) * QS + dd];
#pragma unroll
      for (int j = 0; j < TN; ++j) bk[j] = KVs[(cg + 16 * j) * KS + dd];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) s[i][j] = {fma}(a[i], bk[j], s[i][j]);
    }}
    C alpha[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) {{
      const int qi = q0 + rg + 16 * i;
      C mx = NEG_INF;
#pragma unroll
      for (int j = 0; j < TN; ++j) {{
        const int kj = n0 + cg + 16 * j;
        C x = s[i][j];
        if (HAS_MASK && qi < sq && kj < sk)
          x += {load}(mask[moff[b] + (long long)qi * msq + (long long)kj * msk]);
        if (kj >= sk || (CAUSAL && kj > qi)) x = NEG_INF;
        s[i][j] = x;
        mx = fmax(mx, x);
      }}
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const C mnew = fmax(mi[i], mx);
      // a row with every key hidden so far shifts by 0: exp(-inf) = 0, never NaN
      const C sh = (mnew == NEG_INF) ? (C)0 : mnew;
      alpha[i] = {exp}(mi[i] - sh);
      C rs = (C)0;
#pragma unroll
      for (int j = 0; j < TN; ++j) {{ s[i][j] = {exp}(s[i][j] - sh); rs += s[i][j]; }}
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, off);
      li[i] = li[i] * alpha[i] + rs;
      mi[i] = mnew;
    }}
    __syncthreads();  // every thread is done reading the key tile
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) Ps[(rg + 16 * i) * PS + cg + 16 * j] = s[i][j];
    for (int idx = t; idx < BN * DV; idx += {THREADS}) {{
      const int n = idx / DV, cc = idx - n * DV;
      KVs[n * KS + cc] = (n0 + n < sk) ? {load}(vb[(long long)(n0 + n) * VRS + cc]) : (C)0;
    }}
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) o[i][jj] *= alpha[i];
#pragma unroll 4
    for (int n = 0; n < BN; ++n) {{
      C p[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) p[i] = Ps[(rg + 16 * i) * PS + n];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {{
        const int cc = cg + 16 * jj;
        const C vv = (cc < DV) ? KVs[n * KS + cc] : (C)0;
#pragma unroll
        for (int i = 0; i < TM; ++i) o[i][jj] = {fma}(p[i], vv, o[i][jj]);
      }}
    }}
  }}
#pragma unroll
  for (int i = 0; i < TM; ++i) {{
    const int qi = q0 + rg + 16 * i;
    if (qi >= sq) continue;
#pragma unroll
    for (int jj = 0; jj < NJ; ++jj) {{
      const int cc = cg + 16 * jj;
      // li == 0 (every key hidden) gives 0/0 = NaN, as the softmax of an all -inf row
      if (cc < DV) ob[(long long)qi * ORS + cc] = {store}(o[i][jj] / li[i]);
    }}
  }}
}}
"""
