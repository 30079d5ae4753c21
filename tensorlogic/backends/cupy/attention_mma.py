"""CUDA C of the attention op's tensor-core path: bfloat16/float16 flash attention (sm_80+).

The FlashAttention-2 forward structure. A block of 4 or 8 warps owns the query rows of one batch
index, 16 or 32 rows per warp (``Config``); the key and value tiles (64 keys) stream through
shared memory two stages deep with ``cp.async`` (tile t + 1 is in flight while tile t is used),
in rows padded by 16 bytes so the ``ldmatrix`` reads of eight rows hit eight different bank
groups.

Per tile each warp computes its scores with ``mma.sync.m16n8k16`` (16-bit inputs, float32
accumulation; the query fragments stay in registers, or for wide heads are read from shared
memory with ``ldmatrix`` per use; with 32 rows a warp, each key and value fragment feeds two
MMAs) and runs the online softmax on the accumulator fragments in the base-2 domain: the
scale is folded into ``log2(e)``, so each probability is one multiply and one ``ex2``. A row's
values live in the 4 lanes of a quad (two shuffles give its maximum; the sum is reduced once at
the end). The probabilities are rounded to 16 bits and reused as the A fragments of ``P V``
without touching shared memory; the value B fragments come from ``ldmatrix.trans``. The output
accumulates in float32, is rounded once and leaves through shared memory as 16-byte rows.
Where no row of a warp's m-tile changed its maximum (most tiles after the first few), the
output's rescale (one multiply per accumulator) is skipped.

Instruction count: every shared-memory address is a 32-bit lane base plus a compile-time constant
(``ldmatrix`` and ``cp.async`` take the constant as their offset), and each thread's tile rows are
a fixed step apart, so a tile costs few integer instructions beside its MMAs (H100, bf16, S=4096,
head dim 128: 0.256 -> 0.219 ms, 0.79x -> 0.92x torch's flash SDPA; ``benchmarks/RESULTS.md``).

Causal: a block stops after the diagonal; a warp skips the tiles wholly right of its rows and
masks only the tiles its diagonal crosses; with paired blocks, block i runs query blocks
n - 1 - i and then i, so every block walks about the same number of key tiles. The additive mask
is read element-wise where given.
Scratch: shared memory only (O(rows * head dim) per block), nothing in device memory.

Layouts: each of q, k, v and the output is read or written through a batch decomposition and a
row stride (the node's ``layout``, ``ir/attention.py``), so ``(B, S, H, D)`` tensors from the
projections need no regrouping copy.

Limits: head dims ``D`` and ``Dv`` multiples of 16, at most 128, 16-byte aligned rows
(``attention_gpu`` checks and otherwise uses the exact FFMA kernel of ``attention_c``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import BackendError

BN = 64
MAX_HEAD_DIM = 128
DTYPES = {"float16": "f16", "bfloat16": "bf16"}

# shared-memory address and cp.async primitives (the float32 kernel of attention_tf32 uses them)
ASYNC_COPY_HELPERS = r"""
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
"""

_HELPERS = r"""
__device__ __forceinline__ void tl_att_ldm(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory"); }
__device__ __forceinline__ void tl_att_ldm_t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory"); }
// ROWS rows of CPR 16-byte chunks from src (row stride GS elements) to the shared address dst
// (row stride SS elements); rows from ``avail`` on are zero-filled. Where the threads divide
// a row's chunks, each thread's rows are a fixed step apart: the addresses are one base plus
// constants, no division per chunk.
template <int ROWS, int CPR, int THREADS, int SS, long long GS>
__device__ __forceinline__ void tl_att_load_rows(unsigned dst, const unsigned short* src,
                                                 int tid, int avail) {
  if (THREADS % CPR == 0) {  // a constant: the other branch is compiled away
    constexpr int STEP = THREADS / CPR;
    const int r0 = tid / CPR, c0 = (tid - r0 * CPR) * 8;
#pragma unroll
    for (int i = 0; i < (ROWS + STEP - 1) / STEP; ++i) {
      const int r = r0 + i * STEP;
      if (ROWS % STEP == 0 || r < ROWS) {
        const bool in = r < avail;
        tl_att_cp16(dst + (unsigned)(r * SS + c0) * 2u, src + (in ? r * GS + c0 : 0), in);
      }
    }
  } else {
    for (int c = tid; c < ROWS * CPR; c += THREADS) {
      const int r = c / CPR, cc = (c - r * CPR) * 8;
      const bool in = r < avail;
      tl_att_cp16(dst + (unsigned)(r * SS + cc) * 2u, src + (in ? r * GS + cc : 0), in);
    }
  }
}
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


def _check_inner(inner) -> None:
    if len(inner) != 4 or not all(isinstance(x, int) and x >= 1 for x in inner):
        raise BackendError(
            f"attention kernel: inner batch counts must be four positive ints, got {inner!r}"
        )


@dataclass(frozen=True)
class Config:
    """The block shape of one kernel.

    Args:
        warps: warps per block (4 or 8).
        mt: 16-row m-tiles per warp (1 or 2): with 2, each key and value fragment read from
            shared memory feeds twice the MMAs (FlashAttention-2's 32 rows per warp).
        q_in_regs: keep the query fragments in registers for the whole kernel (else each is read
            from shared memory per use: fewer registers for wide heads).
        pair: causal only: a block runs query block ``i`` and then ``n - 1 - i``, so every block
            walks about the same number of key tiles (grid: half the query blocks).
        bn: keys per tile (32, 64 or 128): longer tiles mean fewer barriers and rescales of the
            output per key, more score registers.
    """

    warps: int = 8
    mt: int = 1
    q_in_regs: bool = True
    pair: bool = False
    bn: int = BN

    @property
    def rows(self) -> int:
        """Query rows of one block (per pass)."""
        return 16 * self.mt * self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps


def shared_bytes(d: int, dv: int, cfg: Config) -> int:
    """Dynamic shared memory of one block: the query (then output) tile, two key and two value
    tiles, rows padded by 8 elements (16 bytes)."""
    return 2 * (cfg.rows * (max(d, dv) + 8) + 2 * cfg.bn * (d + 8) + 2 * cfg.bn * (dv + 8))


def grid_x(sq: int, causal: bool, cfg: Config) -> int:
    """Blocks along the query axis."""
    nq = -(-sq // cfg.rows)
    return -(-nq // 2) if causal and cfg.pair else nq


def render(
    name: str,
    d: int,
    dv: int,
    dtype: str,
    causal: bool,
    has_mask: bool,
    cfg: Config = Config(),
    helpers: bool = True,
    inner: tuple[int, int, int, int] = (1, 1, 1, 1),
    positive_scale: bool = False,
) -> str:
    """The kernel ``name`` with the FFMA kernel's signature (16-bit pointers, float scale);
    ``positive_scale``: the kernel is only called with a scale > 0 (without a mask tensor, the
    row maxima are then taken on the unscaled scores and scale and shift are one FMA);
    ``inner``: the inner batch counts of q, k, v and out (their layout,
    ``attention_gpu.layout_strides``; all 1 for the canonical layout); grid
    (``grid_x``, batch indices), ``cfg.threads`` threads, dynamic shared memory
    ``shared_bytes``. ``helpers=False`` leaves out the device functions (to put several kernels
    in one source)."""
    if not supports(d, dv, dtype):
        raise BackendError(
            f"tensor-core attention: {dtype} with head dims {d}/{dv}; it takes "
            f"{sorted(DTYPES)} and head dims that are multiples of 16 up to "
            f"{MAX_HEAD_DIM}"
        )
    _check_inner(inner)
    if cfg.warps not in (4, 8) or cfg.mt not in (1, 2) or cfg.bn not in (32, 64, 128):
        raise BackendError(
            f"tensor-core attention: 4 or 8 warps of 1 or 2 m-tiles, 32, 64 or 128 keys a "
            f"tile, not {cfg}"
        )
    ty = DTYPES[dtype]
    pair = causal and cfg.pair
    # registers a thread holds across a tile: output and score accumulators, query fragments;
    # where they are few, cap at 128 registers (16 warps a multiprocessor), else at 255
    held = cfg.mt * (dv // 2 + cfg.bn // 2 + (d // 4 if cfg.q_in_regs else 0))
    min_blocks = max(1, (512 if held <= 96 else 256) // cfg.threads)
    flags = (
        f"causal={int(causal)} mask={int(has_mask)} warps={cfg.warps} mt={cfg.mt} "
        f"qregs={int(cfg.q_in_regs)} pair={int(pair)} bn={cfg.bn} "
        f"pos={int(positive_scale)} inner={','.join(map(str, inner))}"
    )
    qfrag = "qa[i][kk]" if cfg.q_in_regs else "qf[i]"
    return f"""// tensorlogic generated: attention mma {dtype} d={d} dv={dv} {flags}
{ASYNC_COPY_HELPERS + _HELPERS if helpers else ""}
extern "C" __global__ void __launch_bounds__({cfg.threads}, {min_blocks}) {name}(
    unsigned short* __restrict__ out, const unsigned short* __restrict__ q,
    const unsigned short* __restrict__ k, const unsigned short* __restrict__ v,
    const unsigned short* __restrict__ mask, const long long* __restrict__ moff,
    int sq, int sk, long long msq, long long msk, float scale, int batch0)
{{
  constexpr int WARPS = {cfg.warps}, MT = {cfg.mt}, THREADS = 32 * WARPS, BM = 16 * MT * WARPS;
  constexpr int BN = {cfg.bn}, D = {d}, DV = {dv}, WR = 16 * MT;
  constexpr int KS = D + 8, VS = DV + 8, OS = (D > DV ? D : DV) + 8;
  constexpr int KD = D / 16, NT = BN / 8, NO = DV / 8;
  constexpr bool CAUSAL = {str(causal).lower()}, HAS_MASK = {str(has_mask).lower()};
  constexpr bool QREGS = {str(cfg.q_in_regs).lower()}, PAIR = {str(pair).lower()};
  // scale > 0 and no mask tensor: maxima of the raw scores, scale and shift in one FMA
  constexpr bool RAW = {str(positive_scale and not has_mask).lower()};
  // the layout: batch axes after the sequence axis (inner) and the row stride of each tensor
  constexpr int QIN = {inner[0]}, KIN = {inner[1]}, VIN = {inner[2]}, OIN = {inner[3]};
  constexpr long long QRS = (long long)QIN * D, KRS = (long long)KIN * D;
  constexpr long long VRS = (long long)VIN * DV, ORS = (long long)OIN * DV;
  extern __shared__ __align__(16) unsigned char tl_smem[];
  unsigned short* Qs = (unsigned short*)tl_smem;  // the query tile, at the end the output tile
  // shared addresses in bytes: the query tile, then two stages of keys and two of values;
  // every fragment address is a lane base plus a constant (folded into the instruction)
  constexpr unsigned KSTG = BN * KS * 2, VSTG = BN * VS * 2;
  const unsigned qs_a = tl_att_smem(tl_smem), ks_a = qs_a + BM * OS * 2, vs_a = ks_a + 2 * KSTG;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const long long b = (long long)blockIdx.y + batch0;
  // tensor X's rows of batch index b = (outer, inner): X + outer * Xos + inner * (head dim),
  // row r at r * Xrs (``layout_strides``; canonical: Xin = 1, Xrs = the head dim)
  const unsigned short* kb = k + (b / KIN) * sk * KRS + (b % KIN) * D;
  const unsigned short* vb = v + (b / VIN) * sk * VRS + (b % VIN) * DV;
  const float NEG_INF = __int_as_float(0xff800000);
  const float LOG2E = 1.4426950408889634f;
  const float sl2 = scale * LOG2E;
  const int nq = (sq + BM - 1) / BM;
  // the lane's ldmatrix row and column: matrices 0-3 are lanes 0-7, 8-15, 16-23, 24-31
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 8;
  const int kr = (lane & 7) + (lane >> 4) * 8, kc = ((lane >> 3) & 1) * 8;
  unsigned short* wq = Qs + warp * WR * OS;  // this warp's rows of the query/output tile
  const unsigned q_l = qs_a + ((warp * WR + lr) * OS + lc) * 2;  // ldmatrix lane addresses
  const unsigned k_l = (kr * KS + kc) * 2, v_l = (lr * VS + lc) * 2;

  for (int pass = 0; pass < (PAIR ? 2 : 1); ++pass) {{
  // causal: the longest rows start first; paired, the second pass takes the mirror block
  const int qblk = PAIR ? (pass == 0 ? nq - 1 - (int)blockIdx.x : (int)blockIdx.x)
                        : (CAUSAL ? nq - 1 - (int)blockIdx.x : (int)blockIdx.x);
  if (PAIR && pass == 1 && qblk >= nq - 1 - (int)blockIdx.x) break;  // the middle block
  const int q0 = qblk * BM;
  const unsigned short* qb = q + (b / QIN) * sq * QRS + (b % QIN) * D + (long long)q0 * QRS;
  const int kend = (CAUSAL && q0 + BM < sk) ? q0 + BM : sk;
  const int ntiles = (kend + BN - 1) / BN;
  __syncthreads();  // the previous pass is done with the output tile

  tl_att_load_rows<BM, D / 8, THREADS, OS, QRS>(qs_a, qb, tid, sq - q0);
  auto load_tile = [&](int t) {{
    const int n0 = t * BN;
    tl_att_load_rows<BN, D / 8, THREADS, KS, KRS>(ks_a + (t & 1) * KSTG, kb + n0 * KRS, tid,
                                                  sk - n0);
    tl_att_load_rows<BN, DV / 8, THREADS, VS, VRS>(vs_a + (t & 1) * VSTG, vb + n0 * VRS, tid,
                                                   sk - n0);
  }};
  if (ntiles > 0) load_tile(0);
  tl_att_commit();  // group 0: the query tile and tile 0

  unsigned qa[QREGS ? MT : 1][QREGS ? KD : 1][4];
  float o[MT][NO][4], m[MT][2], l[MT][2];  // m in log2 units; l: the lane's partial sums
#pragma unroll
  for (int i = 0; i < MT; ++i) {{
    m[i][0] = m[i][1] = NEG_INF; l[i][0] = l[i][1] = 0.f;
#pragma unroll
    for (int j = 0; j < NO; ++j) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.f;
  }}
  const int wr0 = q0 + warp * WR;

  for (int t = 0; t < ntiles; ++t) {{
    if (t + 1 < ntiles) load_tile(t + 1);
    tl_att_commit();   // one group per iteration, empty at the end, so wait_group 1 is tile t
    tl_att_wait1();
    __syncthreads();
    if (QREGS && t == 0) {{
#pragma unroll
      for (int i = 0; i < (QREGS ? MT : 0); ++i)
#pragma unroll
        for (int kk = 0; kk < KD; ++kk)
          tl_att_ldm(qa[QREGS ? i : 0][QREGS ? kk : 0], q_l + (i * 16 * OS + kk * 16) * 2);
    }}
    const int n0 = t * BN;
    // causal: a tile wholly right of this warp's rows adds nothing
    if (!CAUSAL || n0 <= wr0 + WR - 1) {{
      const unsigned kt = ks_a + (t & 1) * KSTG + k_l, vt = vs_a + (t & 1) * VSTG + v_l;
      float s[MT][NT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {{
        unsigned qf[QREGS ? 1 : MT][4];
        if (!QREGS) {{
#pragma unroll
          for (int i = 0; i < (QREGS ? 0 : MT); ++i)
            tl_att_ldm(qf[i], q_l + (i * 16 * OS + kk * 16) * 2);
        }}
#pragma unroll
        for (int jj = 0; jj < NT / 2; ++jj) {{
          unsigned kf[4];
          tl_att_ldm(kf, kt + (jj * 16 * KS + kk * 16) * 2);
#pragma unroll
          for (int i = 0; i < MT; ++i) {{
            tl_att_mma_{ty}(s[i][2 * jj], {qfrag}, kf[0], kf[1]);
            tl_att_mma_{ty}(s[i][2 * jj + 1], {qfrag}, kf[2], kf[3]);
          }}
        }}
      }}
      // only the diagonal tiles of a causal mask, the last tile and a user's mask need masking
      const bool masked = HAS_MASK || n0 + BN > sk || (CAUSAL && n0 + BN - 1 > wr0);
#pragma unroll
      for (int i = 0; i < MT; ++i) {{
        const int row0 = wr0 + i * 16 + g, row1 = row0 + 8;
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
#pragma unroll
          for (int e = 0; e < 4; ++e) {{
            float x = RAW ? s[i][j][e] : s[i][j][e] * sl2;
            if (masked) {{
              const int row = e < 2 ? row0 : row1;
              const int col = n0 + j * 8 + 2 * t4 + (e & 1);
              if (HAS_MASK && row < sq && col < sk)
                x += LOG2E * tl_att_{ty}_f32(mask[moff[b] + (long long)row * msq
                                                 + (long long)col * msk]);
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
        if (RAW) {{ mx0 *= sl2; mx1 *= sl2; }}  // -inf stays -inf (sl2 > 0)
        const float mn0 = fmaxf(m[i][0], mx0), mn1 = fmaxf(m[i][1], mx1);
        // a row with every key hidden so far shifts by 0: 2^-inf = 0, never NaN
        const float sh0 = (mn0 == NEG_INF) ? 0.f : mn0, sh1 = (mn1 == NEG_INF) ? 0.f : mn1;
        const float al0 = tl_att_ex2(m[i][0] - sh0), al1 = tl_att_ex2(m[i][1] - sh1);
        // p = 2^(x * sl2 - shift): one FMA for raw scores
        const float f = RAW ? sl2 : 1.f;
        float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {{
          s[i][j][0] = tl_att_ex2(fmaf(s[i][j][0], f, -sh0));
          s[i][j][1] = tl_att_ex2(fmaf(s[i][j][1], f, -sh0));
          s[i][j][2] = tl_att_ex2(fmaf(s[i][j][2], f, -sh1));
          s[i][j][3] = tl_att_ex2(fmaf(s[i][j][3], f, -sh1));
          rs0 += s[i][j][0] + s[i][j][1]; rs1 += s[i][j][2] + s[i][j][3];
        }}
        // the quad shares the row maximum, so the lanes' partial sums add up at the end
        l[i][0] = l[i][0] * al0 + rs0; l[i][1] = l[i][1] * al1 + rs1;
        // after the first tiles the maxima rarely move: where no row of the warp's m-tile
        // moved, every factor is 2^0 = 1 and the rescale is skipped
        const bool moved = mn0 != m[i][0] || mn1 != m[i][1];
        m[i][0] = mn0; m[i][1] = mn1;
        if (__any_sync(0xffffffffu, moved)) {{
#pragma unroll
          for (int j = 0; j < NO; ++j) {{
            o[i][j][0] *= al0; o[i][j][1] *= al0; o[i][j][2] *= al1; o[i][j][3] *= al1;
          }}
        }}
      }}
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {{
        unsigned pa[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i) {{
          pa[i][0] = tl_att_pack_{ty}(s[i][2 * kk][0], s[i][2 * kk][1]);
          pa[i][1] = tl_att_pack_{ty}(s[i][2 * kk][2], s[i][2 * kk][3]);
          pa[i][2] = tl_att_pack_{ty}(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
          pa[i][3] = tl_att_pack_{ty}(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
        }}
#pragma unroll
        for (int jj = 0; jj < NO / 2; ++jj) {{
          unsigned vf[4];
          tl_att_ldm_t(vf, vt + (kk * 16 * VS + jj * 16) * 2);
#pragma unroll
          for (int i = 0; i < MT; ++i) {{
            tl_att_mma_{ty}(o[i][2 * jj], pa[i], vf[0], vf[1]);
            tl_att_mma_{ty}(o[i][2 * jj + 1], pa[i], vf[2], vf[3]);
          }}
        }}
      }}
    }}
    __syncthreads();  // every warp is done with stage t & 1 before tile t + 2 goes there
  }}
  tl_att_wait0();
  __syncthreads();  // no copy into the query tile is pending (a block with no key tiles)
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
    unsigned short* os = wq + i * 16 * OS;  // this warp's own rows: no other warp reads them
#pragma unroll
    for (int j = 0; j < NO; ++j) {{
      *(unsigned*)(os + g * OS + j * 8 + 2 * t4) =
          tl_att_pack_{ty}(o[i][j][0] * i0, o[i][j][1] * i0);
      *(unsigned*)(os + (g + 8) * OS + j * 8 + 2 * t4) =
          tl_att_pack_{ty}(o[i][j][2] * i1, o[i][j][3] * i1);
    }}
  }}
  __syncwarp();
  // computed late: fewer registers held across the tiles
  unsigned short* ob = out + (b / OIN) * sq * ORS + (b % OIN) * DV;
  for (int c = lane; c < WR * (DV / 8); c += 32) {{
    const int r = c / (DV / 8), cc = (c - r * (DV / 8)) * 8;
    if (wr0 + r < sq)
      *(uint4*)(ob + (long long)(wr0 + r) * ORS + cc) = *(const uint4*)(wq + r * OS + cc);
  }}
  }}  // pass
}}
"""
