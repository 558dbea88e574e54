// Tensor-core building blocks for sm_80 and later (Ampere's mma.sync, which Hopper runs too): the
// bf16 m16n8k16 product with f32 accumulation, its fragment layouts, and shared-memory tile
// loads. Fragment layout (PTX ISA, "mma.m16n8k16", g = lane / 4, c = lane % 4):
//   A (16 x 16, row major): a0 = A[g][2c, 2c+1], a1 = A[g+8][2c, 2c+1], a2 = A[g][2c+8, 2c+9],
//                           a3 = A[g+8][2c+8, 2c+9]
//   B (16 x 8, k x n):      b0 = B[2c, 2c+1][g], b1 = B[2c+8, 2c+9][g]
//   C (16 x 8, f32):        c0, c1 = C[g][2c, 2c+1], c2, c3 = C[g+8][2c, 2c+1]
// Each 32-bit register holds two bf16, the smaller column (or k) index in the low half. So a B
// operand whose k runs along a row of shared memory (K in Q K^T) loads as one 32-bit word, and
// an accumulator tile C turns into the A operand of the next product without leaving registers.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

// A kernel's dynamic shared memory (the SIMT emulator of tests/cuda/emu defines its own).
#ifndef HMLA_DYNAMIC_SHARED
#define HMLA_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

// The emulator's work counter (tests/cuda/emu/emulate.h) sees the global bytes the tile loaders
// read; on a GPU the hook is nothing.
#ifdef HMLA_CUDA_EMULATE
#define HMLA_COUNT_LOAD(bytes) ::hmla::emu::count_load_bytes(bytes)
#else
#define HMLA_COUNT_LOAD(bytes) ((void)0)
#endif

namespace hmla::cuda {

__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef HMLA_CUDA_EMULATE
  emu::mma_bf16_16816(c, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The m16n8k8 product, for a last step of 8 keys: A (16 x 8) a0 = A[g][2c, 2c+1], a1 = A[g+8][2c, 2c+1];
// B (8 x 8) b = B[2c, 2c+1][g]; C as above.
__device__ __forceinline__ void mma_bf16_1688(float c[4], const uint32_t a[2], uint32_t b) {
#ifdef HMLA_CUDA_EMULATE
  emu::mma_bf16_1688(c, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major shared tile.
__device__ __forceinline__ void load_a(uint32_t a[4], const __nv_bfloat16* s, int ld, int r0, int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  a[0] = ld32(s + (r0 + g) * ld + k0 + 2 * c);
  a[1] = ld32(s + (r0 + g + 8) * ld + k0 + 2 * c);
  a[2] = ld32(s + (r0 + g) * ld + k0 + 8 + 2 * c);
  a[3] = ld32(s + (r0 + g + 8) * ld + k0 + 8 + 2 * c);
}

// B fragment (k in [k0, k0 + 16), n in [n0, n0 + 8)) from a shared tile holding B^T row major,
// i.e. row n of the tile is column n of B (K rows for Q K^T, V rows for dO V^T, transposed tiles).
__device__ __forceinline__ void load_b(uint32_t b[2], const __nv_bfloat16* s, int ld, int n0, int k0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  b[0] = ld32(s + (n0 + g) * ld + k0 + 2 * c);
  b[1] = ld32(s + (n0 + g) * ld + k0 + 8 + 2 * c);
}

// The A fragment for k-block kt of a product whose A is a 16 x N accumulator tile held as N / 8
// C fragments (p[2 kt] and p[2 kt + 1]), rounded to bf16.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Rows [0, nrows) of a [rows, ncols] bf16 tile into shared memory (row stride ld), reading global
// row r at g + row(r) * rstride with row(r) = r, or rows[r] when a list is given (a gather); rows
// >= valid are zero. 16-byte accesses when `vec` (ncols, rstride and g 8-element aligned), else
// element by element. All threads of the block take part.
__device__ inline void load_tile(__nv_bfloat16* s, int ld, const __nv_bfloat16* g, int64_t rstride, int nrows,
                                 int valid, int ncols, bool vec, const int32_t* rows = nullptr) {
  const __nv_bfloat16 zero = __float2bfloat16(0.f);
  auto src = [&](int r) { return g + int64_t(rows ? rows[r] : r) * rstride; };
  if (vec) {
    const int per_row = ncols / 8;
    for (int i = threadIdx.x; i < nrows * per_row; i += blockDim.x) {
      const int r = i / per_row, c = (i % per_row) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < valid) v = *reinterpret_cast<const uint4*>(src(r) + c), HMLA_COUNT_LOAD(16);
      *reinterpret_cast<uint4*>(s + r * ld + c) = v;
    }
  } else {
    for (int i = threadIdx.x; i < nrows * ncols; i += blockDim.x) {
      const int r = i / ncols, c = i % ncols;
      s[r * ld + c] = r < valid ? (HMLA_COUNT_LOAD(2), src(r)[c]) : zero;
    }
  }
}

// ---- cp.async (sm_80+): global to shared memory without passing through registers --------------
// 16 bytes from gmem to smem (both 16-byte aligned), or 16 zero bytes when !valid (src-size 0: no
// byte is read). Asynchronous: a thread's copies land when it waits for their group
// (cp_async_wait<N>: all but its newest N committed groups), and the block sees them after a
// barrier. The emulator lands them only at that wait, so a read before it shows.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#ifdef HMLA_CUDA_EMULATE
  emu::cp_async(smem, gmem, 16, valid ? 16 : 0);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef HMLA_CUDA_EMULATE
  emu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef HMLA_CUDA_EMULATE
  emu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// load_tile's rows [0, nrows) by cp.async when `vec` (16-byte rows), else load_tile itself
// (synchronous): the caller commits and waits either way. All threads of the block take part.
__device__ inline void load_tile_async(__nv_bfloat16* s, int ld, const __nv_bfloat16* g, int64_t rstride, int nrows,
                                       int valid, int ncols, bool vec) {
  if (!vec) return load_tile(s, ld, g, rstride, nrows, valid, ncols, false);
  const int per_row = ncols / 8;
  for (int i = threadIdx.x; i < nrows * per_row; i += blockDim.x) {
    const int r = i / per_row, c = (i % per_row) * 8;
    if (r < valid) HMLA_COUNT_LOAD(16);
    cp_async16(s + r * ld + c, r < valid ? g + int64_t(r) * rstride + c : g, r < valid);
  }
}
// A tile loop's load pipeline over `stages` (1 or 2) shared buffers. pipeline_start before the
// loop; pipeline_step at the top of iteration `it`: the barrier after which the buffer refilled next
// is free, then with two stages the prefetch of tile it + 1 (`more`: it exists) into the other
// buffer while tile it's copies, issued an iteration earlier, are waited for; with one, tile it's
// load and its wait; then the barrier that makes tile it visible. load(ahead, stage) issues tile
// it + ahead's copies into `stage` (load_tile_async). Returns tile it's stage.
template <class Load>
__device__ __forceinline__ void pipeline_start(int stages, bool any, Load load) {
  if (stages == 2 && any) load(0, 0);
  cp_async_commit();
}
template <class Load>
__device__ __forceinline__ int pipeline_step(int stages, int it, bool more, Load load) {
  const int st = stages == 2 ? it & 1 : 0;
  __syncthreads();
  if (stages == 2) {
    if (more) load(1, st ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // all but the prefetch just committed: tile it
  } else {
    load(0, 0);
    cp_async_commit();
    cp_async_wait<0>();
  }
  __syncthreads();
  return st;
}
// ---- end cp.async ----------------------------------------------------------------------------

// Two bf16 of shared memory (bits, no conversion) as one operand register, `lo` in the low half.
__device__ __forceinline__ uint32_t ld16x2(const __nv_bfloat16* lo, const __nv_bfloat16* hi) {
  return uint32_t(*reinterpret_cast<const uint16_t*>(lo)) | (uint32_t(*reinterpret_cast<const uint16_t*>(hi)) << 16);
}

// B fragment (k in [k0, k0 + 16), n in [n0, n0 + 8)) from a shared tile holding B itself row major
// (row k, column n: kI rows for dS kI, qI rows for dS^T qI): each register pairs two rows, so it
// takes two 16-bit loads (ldmatrix.trans would take one instruction for four such registers).
__device__ __forceinline__ void load_b_kn(uint32_t b[2], const __nv_bfloat16* s, int ld, int k0, int n0, int lane) {
  const int g = lane >> 2, c = lane & 3;
  const __nv_bfloat16* col = s + n0 + g;
  b[0] = ld16x2(col + (k0 + 2 * c) * ld, col + (k0 + 2 * c + 1) * ld);
  b[1] = ld16x2(col + (k0 + 2 * c + 8) * ld, col + (k0 + 2 * c + 9) * ld);
}

// ---- ldmatrix (the sparse backward, issue 30) ---------------------------------------------------
// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16, warp-collective: four 8 x 8 bf16 matrices M_m
// of shared memory, lane l giving the address of row l % 8 of M_(l / 8) (16-byte aligned); lane
// (g, c) receives r[m] = {M_m[2c][g], M_m[2c + 1][g]}, the transpose's fragment.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const __nv_bfloat16* row) {
#ifdef HMLA_CUDA_EMULATE
  emu::ldsm_x4_trans(r, row);
#else
  const uint32_t a = uint32_t(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}

// The B fragments of n-tiles [n0, n0 + 8) (b0) and [n0 + 8, n0 + 16) (b1), k in [k0, k0 + 16),
// from a shared tile holding B itself row major (row k, column n), in one ldmatrix.trans: what
// load_b_kn takes eight 16-bit loads for. Row addresses (s + k * ld + n0) 16-byte aligned: s
// aligned, ld and n0 multiples of 8.
__device__ __forceinline__ void load_b_kn_x2(uint32_t b0[2], uint32_t b1[2], const __nv_bfloat16* s, int ld, int k0,
                                             int n0, int lane) {
  const int m = lane >> 3, i = lane & 7;
  uint32_t r[4];
  ldsm_x4_trans(r, s + (k0 + i + (m & 1) * 8) * ld + n0 + (m >> 1) * 8);
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
// ---- end ldmatrix ----------------------------------------------------------------------------

// Rows [0, nrows) of a [rows, ncols] bf16 tile into shared memory (row stride ld), zero-padded to
// ncols_pad columns (an operand width that is not a multiple of 16) and past `valid` rows; global
// row r at g + row(r) * rstride with row(r) = r, or rows[r] when a list is given (a gather).
// 16-byte accesses when ncols, rstride and g are 8-element aligned, else element by element. All
// threads of the block take part.
__device__ inline void load_tile_padded(__nv_bfloat16* s, int ld, const __nv_bfloat16* g, int64_t rstride, int nrows,
                                        int valid, int ncols, int ncols_pad, const int32_t* rows = nullptr) {
  const __nv_bfloat16 zero = __float2bfloat16(0.f);
  auto src = [&](int r) { return g + int64_t(rows ? rows[r] : r) * rstride; };
  if (ncols % 8 == 0 && rstride % 8 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
    const int per_row = ncols_pad / 8;
    for (int i = threadIdx.x; i < nrows * per_row; i += blockDim.x) {
      const int r = i / per_row, c = (i % per_row) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < valid && c < ncols) v = *reinterpret_cast<const uint4*>(src(r) + c);
      *reinterpret_cast<uint4*>(s + r * ld + c) = v;
    }
  } else {
    for (int i = threadIdx.x; i < nrows * ncols_pad; i += blockDim.x) {
      const int r = i / ncols_pad, c = i % ncols_pad;
      s[r * ld + c] = r < valid && c < ncols ? src(r)[c] : zero;
    }
  }
}

// ---- warp-level products: one warp, 16 rows of A ------------------------------------------------

template <int N>
__device__ __forceinline__ void zero_acc(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// One k-step of 16 of mma_abt.
template <int kNt>
__device__ __forceinline__ void mma_abt_step(float (&acc)[kNt][4], const __nv_bfloat16* A, int lda, int r0,
                                             const __nv_bfloat16* Bt, int ldb, int k0, int lane) {
  uint32_t a[4];
  load_a(a, A, lda, r0, k0, lane);
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    uint32_t b[2];
    load_b(b, Bt, ldb, nt * 8, k0, lane);
    mma_bf16_16816(acc[nt], a, b);
  }
}

// acc[nt] += A[r0, r0 + 16) x B^T over k in [0, K), for the kNt n-tiles of 8: A and B^T are
// row-major shared tiles (B^T's row n is B's column n: K rows for Q K^T, V rows for dO V^T).
// kRolled keeps the k loop rolled, for a kernel where unrolling it makes ptxas spill.
template <int kNt, bool kRolled = false>
__device__ __forceinline__ void mma_abt(float (&acc)[kNt][4], const __nv_bfloat16* A, int lda, int r0,
                                        const __nv_bfloat16* Bt, int ldb, int K, int lane) {
  if constexpr (kRolled) {
#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += 16) mma_abt_step(acc, A, lda, r0, Bt, ldb, k0, lane);
  } else {
    for (int k0 = 0; k0 < K; k0 += 16) mma_abt_step(acc, A, lda, r0, Bt, ldb, k0, lane);
  }
}

// The 8-key column tiles of a kNt-tile score block starting at key j0 that meet the key range
// [lo, hi] (bit nt set): a warp-uniform mask, since a warp's range is its 16 rows' union.
template <int kNt>
__device__ __forceinline__ uint32_t live_columns(int64_t j0, int64_t lo, int64_t hi) {
  uint32_t live = 0;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
    if (j0 + nt * 8 <= hi && j0 + nt * 8 + 7 >= lo) live |= 1u << nt;
  return live;
}

// mma_abt over the live n-tiles only (`live` warp-uniform, bit nt for n-tile nt); the others keep
// what they held.
template <int kNt>
__device__ __forceinline__ void mma_abt_live_step(float (&acc)[kNt][4], const __nv_bfloat16* A, int lda, int r0,
                                                  const __nv_bfloat16* Bt, int ldb, int k0, int lane, uint32_t live) {
  uint32_t a[4];
  load_a(a, A, lda, r0, k0, lane);
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    if (!((live >> nt) & 1u)) continue;
    uint32_t b[2];
    load_b(b, Bt, ldb, nt * 8, k0, lane);
    mma_bf16_16816(acc[nt], a, b);
  }
}
template <int kNt, bool kRolled = false>
__device__ __forceinline__ void mma_abt_live(float (&acc)[kNt][4], const __nv_bfloat16* A, int lda, int r0,
                                             const __nv_bfloat16* Bt, int ldb, int K, int lane, uint32_t live) {
  if constexpr (kRolled) {
#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += 16) mma_abt_live_step(acc, A, lda, r0, Bt, ldb, k0, lane, live);
  } else {
    for (int k0 = 0; k0 < K; k0 += 16) mma_abt_live_step(acc, A, lda, r0, Bt, ldb, k0, lane, live);
  }
}

// out[ct] += P X for the first `width` columns (a multiple of 16) of X: P is a 16 x (8 kNt)
// accumulator tile (scores, probabilities or their gradients) turned into A operands in registers,
// X a row-major shared tile (row k: the k-th key, e.g. V's rows) whose B operands come by
// ldmatrix.trans (16-byte aligned rows). A k-step whose two column tiles of P are both dead in
// `live` (P exactly 0 there: products of +0 that would change nothing) is skipped.
template <int kNt, int kCt>
__device__ __forceinline__ void mma_acc_kn(float (&out)[kCt][4], const float (&p)[kNt][4], const __nv_bfloat16* X,
                                           int ldx, int width, int lane, uint32_t live = ~0u) {
  static_assert(kCt % 2 == 0, "column tiles in pairs");
#pragma unroll
  for (int kt = 0; kt < kNt / 2; ++kt) {
    if (!((live >> (2 * kt)) & 3u)) continue;
    uint32_t a[4];
    acc_to_a(a, p[2 * kt], p[2 * kt + 1]);
#pragma unroll
    for (int ct = 0; ct < kCt; ct += 2) {
      if (ct * 8 >= width) break;
      uint32_t b0[2], b1[2];
      load_b_kn_x2(b0, b1, X, ldx, kt * 16, ct * 8, lane);
      mma_bf16_16816(out[ct], a, b0);
      mma_bf16_16816(out[ct + 1], a, b1);
    }
  }
}

// out[dt] += P V for the first `width` columns of V, V being rows [0, 8 kNt) of a row-major shared
// tile (the sparse and compressed attentions' gathered keys: a value is its key's first Dv channels, so no transposed copy); P a
// 16 x (8 kNt) accumulator tile turned into A operands in registers. `live` (warp-uniform, a
// prefix of the column tiles) says which 8-key tiles hold listed keys: a 16-key step with both
// live is one m16n8k16 per 8 columns, one with only its first an m16n8k8 (the last step of a row
// whose length is 8 mod 16), one with neither nothing (P is exactly 0 there).
template <int kNt, int kDt>
__device__ __forceinline__ void mma_acc_pv(float (&out)[kDt][4], const float (&p)[kNt][4], const __nv_bfloat16* Vs,
                                           int ldv, int width, int lane, uint32_t live) {
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int kt = 0; kt < kNt / 2; ++kt) {
    const uint32_t both = (live >> (2 * kt)) & 3u;
    if (!both) continue;
    if (both == 3u) {
      uint32_t a[4];
      acc_to_a(a, p[2 * kt], p[2 * kt + 1]);
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        if (dt * 8 >= width) break;
        uint32_t b[2];
        load_b_kn(b, Vs, ldv, kt * 16, dt * 8, lane);
        mma_bf16_16816(out[dt], a, b);
      }
    } else {  // keys [16 kt, 16 kt + 8) only
      const uint32_t a[2] = {pack_bf16(p[2 * kt][0], p[2 * kt][1]), pack_bf16(p[2 * kt][2], p[2 * kt][3])};
      const __nv_bfloat16* col = Vs + (kt * 16 + 2 * c) * ldv + g;
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        if (dt * 8 >= width) break;
        mma_bf16_1688(out[dt], a, ld16x2(col + dt * 8, col + ldv + dt * 8));
      }
    }
  }
}

// The warp's 16 rows (r0 + g, r0 + g + 8) of a shared f32 score tile [., ld] in accumulator layout,
// times c2 (log2 units), -inf at positions j0 + column >= limit and in n-tiles not in `live`.
template <int kNt>
__device__ __forceinline__ void read_scores(float (&s)[kNt][4], const float* Ss, int ld, int r0, int j0, int limit,
                                            float c2, uint32_t live, int lane) {
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + 2 * c + (e & 1);
      const bool ok = ((live >> nt) & 1u) && j0 + col < limit;
      s[nt][e] = ok ? Ss[(r0 + g + (e < 2 ? 0 : 8)) * ld + col] * c2 : -INFINITY;
    }
}

// One tile of an online logsumexp over the rows g (e < 2) and g + 8 (e >= 2) of two 16 x 8
// accumulators: v holds the tile's values, -inf where masked; (mx, l) the lane's running max and
// sum of exp(v - mx) per row (mx = -inf, l = 0 while nothing was seen).
__device__ __forceinline__ void online_lse_tile(const float (&v)[2][4], float (&mx)[2], float (&l)[2]) {
  float tm[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) tm[e >> 1] = fmaxf(tm[e >> 1], v[nt][e]);
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    if (tm[hi] == -INFINITY) continue;
    const float nm = fmaxf(mx[hi], tm[hi]);
    l[hi] *= expf(mx[hi] - nm);  // 0 while nothing was seen (mx = -inf)
    mx[hi] = nm;
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (v[nt][e] > -INFINITY) l[e >> 1] += expf(v[nt][e] - mx[e >> 1]);
}

// Max and sum over the 4 lanes of a quad (the lanes sharing g, i.e. one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The running max m and sum l of the warp's rows A (g) and B (g + 8) over one more tile of masked
// scores in log2 units (-inf where masked); s becomes exp2(s - m). Returns in alA/alB the factors
// that rescale what was accumulated against the old max. While a row has seen nothing allowed, its
// base is 0 (and its factor 0).
template <int kNt>
__device__ __forceinline__ void online_max_sum(float (&s)[kNt][4], float& mA, float& mB, float& lA, float& lB,
                                               float& alA, float& alB) {
  float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < 2) mxA = fmaxf(mxA, s[nt][e]);
      else mxB = fmaxf(mxB, s[nt][e]);
    }
  const float nmA = fmaxf(mA, quad_max(mxA)), nmB = fmaxf(mB, quad_max(mxB));
  const float baseA = nmA == -INFINITY ? 0.f : nmA, baseB = nmB == -INFINITY ? 0.f : nmB;
  alA = exp2f(mA - baseA), alB = exp2f(mB - baseB);
  mA = nmA, mB = nmB;
  lA *= alA, lB *= alB;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    s[nt][0] = exp2f(s[nt][0] - baseA), s[nt][1] = exp2f(s[nt][1] - baseA);
    s[nt][2] = exp2f(s[nt][2] - baseB), s[nt][3] = exp2f(s[nt][3] - baseB);
    lA += s[nt][0] + s[nt][1];
    lB += s[nt][2] + s[nt][3];
  }
}

// One online-softmax step: online_max_sum, then the output accumulator o rescaled.
template <int kNt, int kDt>
__device__ __forceinline__ void online_softmax_step(float (&s)[kNt][4], float& mA, float& mB, float& lA, float& lB,
                                                    float (&o)[kDt][4]) {
  float alA, alB;
  online_max_sum(s, mA, mB, lA, lB, alA, alB);
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) o[dt][0] *= alA, o[dt][1] *= alA, o[dt][2] *= alB, o[dt][3] *= alB;
}

// A finished row (l summed over its quad): the output scale 1 / (l + exp(sink - m)) and
// lse = ln of that denominator; 0 and +inf for a row that saw no key. m, sink2 in log2 units.
__device__ __forceinline__ void softmax_finish(float m, float l, bool sink, float sink2, float& inv, float& lse) {
  inv = 0.f, lse = INFINITY;
  if (l > 0.f) {
    const float den = l + (sink ? exp2f(sink2 - m) : 0.f);
    inv = 1.f / den, lse = (m + log2f(den)) * 0.6931471805599453f;
  }
}

}  // namespace hmla::cuda
