// The CSA indexer's KL on the GPU (hmla/ops/compressed_index.h; docs/csa_indexer_kl.md): simple SIMT
// kernels in f32 math, correct rather than fast (the fast path is issue 46). Deterministic: every sum
// runs in a fixed order (per-thread strides, then reduce.cuh's fixed trees), no atomics on floats.
//   rows     a grid of at most kMaxBlocks blocks walks the query rows; per row its candidates (dense:
//            the visible range; sparse: the visible entries of its K slots, once each, ascending,
//            ranked in shared memory), lseE_h per head (two sweeps: max, then sum), log Z (one thread,
//            f64), I into the block's slice of a [blocks, n] scratch, lseI, then P, kl and dI per
//            candidate; one thread per index head sums G_h over the candidates into dqI and dw.
//   entries  a block per entry (grid-stride) walks the rows that see it, [ent_last, document end)
//            within this call's query rows [q_row0, q_row0 + sq) (context parallelism: positions
//            global, data at local row t - q_row0), in order (sparse: those whose slots list it),
//            recomputing P, I and dI from the rows' saved log Z and lseI, and adds dS^T qI into its
//            dkI row.
//   loss     one thread sums rw[t] kl(t) in row order, as the CPU.
// Inputs: qI, kI and q, ent each pair f32 or bf16, widened on load (f32 math and gradients either way).
// Limits (the plan): H <= kMaxH and K <= kMaxK (shared memory), fewer than 2^31 rows.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda_kernels.h"
#include "entry_range.cuh"
#include "hmla/ops/compressed_index.h"
#include "indexer_scores.cuh"  // input_at
#include "mma.cuh"  // HMLA_DYNAMIC_SHARED
#include "reduce.cuh"
#include "runtime.h"

namespace hmla::cuda {

namespace {

// kThreads: a power of two for reduce.cuh's trees. kMaxBlocks: the rows in flight, so the candidates'
// scratch is kMaxBlocks n floats whatever s is. kMaxH, kMaxK: a row's per-head shifts and its ranked
// candidate list (5 bytes a slot) stay well inside the 48 KB every device gives without opting in.
struct CompressedIndexKlTraits {
  static constexpr int kThreads = 128;
  static constexpr int64_t kMaxBlocks = 256;
  static constexpr int64_t kMaxH = 1024;
  static constexpr int64_t kMaxK = 4096;
};
using KT = CompressedIndexKlTraits;
static_assert((KT::kThreads & (KT::kThreads - 1)) == 0, "2^n threads");
static_assert(KT::kMaxH * 4 + KT::kMaxK * 5 <= 48 * 1024, "shifts and the ranked list within 48 KB");
constexpr int kThreads = KT::kThreads;
using KlP = CompressedIndexKlParams;

cudaStream_t stream() { return current_stream().get(); }

// Local query row `row`'s visible entries [lo, hi); its position t = q_row0 + row % sq is global.
__device__ void row_range(const KlP& p, int64_t row, int64_t& lo, int64_t& hi) {
  const int64_t bb = row / p.sq, t = p.q_row0 + row % p.sq, st = p.doc_start[bb * p.s + t];
  lo = hi = 0;
  if (st > t || p.n_e == 0) return;
  visible_entries(p.ent_doc + bb * p.n_e, p.ent_last + bb * p.n_e, p.n_e, st, t, lo, hi);
}

// qI[row, g] . kI[bb, e] as the indexer's header orders it (a chain of fmaf).
__device__ float index_dot(const KlP& p, int64_t row, int64_t g, int64_t e) {
  const bool bf = p.dtype == DType::bf16;
  const int64_t q = (row * p.nI + g) * p.dI, k = ((row / p.sq) * p.n_e + e) * p.dI;
  float d = 0.f;
  for (int64_t c = 0; c < p.dI; ++c) d = fmaf(input_at(p.qI, q + c, bf), input_at(p.kI, k + c, bf), d);
  return d;
}

__device__ float index_score(const KlP& p, int64_t row, int64_t e) {
  float I = 0.f;
  for (int64_t g = 0; g < p.nI; ++g) {
    const float d = index_dot(p, row, g, e);
    I = fmaf(p.w[row * p.nI + g], d > 0.f ? d : 0.f, I);
  }
  return I;
}

// scale q_h(row) . ent[bb, e] (row local).
__device__ float logit(const KlP& p, int64_t row, int64_t h, int64_t e) {
  const int64_t bb = row / p.sq, t = row % p.sq;
  const bool bf = p.qk_dtype == DType::bf16;
  const int64_t q = bb * p.q_bstride + t * p.q_rstride + h * p.q_hstride, k = (bb * p.n_e + e) * p.d;
  float d = 0.f;
  for (int64_t c = 0; c < p.d; ++c) d = fmaf(input_at(p.q, q + c, bf), input_at(p.ent, k + c, bf), d);
  return p.scale * d;
}

__device__ bool finite(double x) { return x > -INFINITY && x < INFINITY; }

// lse_h + log Z, +inf where the head or the row has no mass (the CPU's shift_of).
__device__ float shift_of(float lse, double logZ) {
  return finite(lse) && finite(logZ) ? float(double(lse) + logZ) : INFINITY;
}

template <bool kSparse>
__global__ void __launch_bounds__(kThreads) rows_kernel(KlP p, float* scratch, int64_t n_max, double* logZ_out,
                                                        float* lseI_out, float* kl_out) {
  HMLA_DYNAMIC_SHARED(float, sh);  // [H] lseE, then the shifts; sparse: [K] i32 list, [K] keep flags
  __shared__ float red[kThreads];
  __shared__ double s_logZ;
  int32_t* list = reinterpret_cast<int32_t*>(sh + p.H);
  unsigned char* keep = reinterpret_cast<unsigned char*>(list + (kSparse ? p.K : 0));
  float* buf = scratch + int64_t(blockIdx.x) * n_max;  // I, then dI, per candidate
  for (int64_t row = blockIdx.x; row < p.b * p.sq; row += gridDim.x) {
    int64_t lo, hi;
    row_range(p, row, lo, hi);
    int64_t n = hi - lo;
    if constexpr (kSparse) {  // the set of visible picks, ascending: slot i's rank among the kept ones
      const int32_t* tk = p.topk + row * p.K;
      for (int64_t i = threadIdx.x; i < p.K; i += kThreads) {
        const int32_t e = tk[i];
        bool k = e >= lo && e < hi;
        for (int64_t j = 0; j < i && k; ++j) k = tk[j] != e;
        keep[i] = k;
      }
      __syncthreads();
      int cnt = 0;
      for (int64_t i = threadIdx.x; i < p.K; i += kThreads) {
        if (!keep[i]) continue;
        ++cnt;
        int rank = 0;
        for (int64_t j = 0; j < p.K; ++j) rank += keep[j] && tk[j] < tk[i];
        list[rank] = tk[i];
      }
      n = int64_t(block_sum<kThreads>(float(cnt), red));
      __syncthreads();
    }
    auto cand = [&](int64_t i) -> int64_t {
      if constexpr (kSparse) return list[i];
      else return lo + i;
    };
    for (int64_t h = 0; h < p.H; ++h) {  // lseE_h: the max, then the sum
      float m = -INFINITY;
      for (int64_t i = threadIdx.x; i < n; i += kThreads) m = fmaxf(m, logit(p, row, h, cand(i)));
      m = block_max<kThreads>(m, red);
      float z = 0.f;
      for (int64_t i = threadIdx.x; i < n; i += kThreads) z += expf(logit(p, row, h, cand(i)) - m);
      z = block_sum<kThreads>(z, red);
      if (threadIdx.x == 0) sh[h] = n > 0 ? m + logf(z) : -INFINITY;
    }
    __syncthreads();
    const int64_t bb = row / p.sq, t = row % p.sq;  // t: the local row
    if (threadIdx.x == 0) {  // log Z in f64 over heads, then the shifts in place of lseE
      double m = -INFINITY, sum = 0;
      for (int64_t h = 0; h < p.H; ++h) m = fmax(m, double(sh[h]) - double(p.lse[(bb * p.H + h) * p.sq + t]));
      if (m > -INFINITY) {
        for (int64_t h = 0; h < p.H; ++h) sum += exp(double(sh[h]) - double(p.lse[(bb * p.H + h) * p.sq + t]) - m);
        m += log(sum);
      }
      s_logZ = m;
      for (int64_t h = 0; h < p.H; ++h) sh[h] = shift_of(p.lse[(bb * p.H + h) * p.sq + t], m);
      logZ_out[row] = m;
    }
    float mI = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) mI = fmaxf(mI, buf[i] = index_score(p, row, cand(i)));
    mI = block_max<kThreads>(mI, red);
    float zI = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) zI += expf(buf[i] - mI);
    zI = block_sum<kThreads>(zI, red);  // its syncs publish s_logZ and the shifts
    const float lseI = n > 0 ? mI + logf(zI) : INFINITY;
    const double logZ = s_logZ;
    if (threadIdx.x == 0) lseI_out[row] = lseI;
    float* dqI = p.dqI + row * p.nI * p.dI;
    float* dw = p.dw + row * p.nI;
    if (!finite(logZ)) {  // no target: kl 0, no gradient (block-uniform)
      for (int64_t i = threadIdx.x; i < p.nI * p.dI; i += kThreads) dqI[i] = 0.f;
      for (int64_t g = threadIdx.x; g < p.nI; g += kThreads) dw[g] = 0.f;
      if (threadIdx.x == 0) kl_out[row] = 0.f;
      __syncthreads();
      continue;
    }
    const float gr = p.coeff * p.row_weight[row];
    float kl = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      float P = 0.f;
      for (int64_t h = 0; h < p.H; ++h) P += expf(logit(p, row, h, cand(i)) - sh[h]);
      const float logq = buf[i] - lseI, Q = expf(logq);
      if (P > 0.f) kl += P * (logf(P) - logq);
      buf[i] = gr * (Q - P);
    }
    kl = block_sum<kThreads>(kl, red);  // its syncs publish dI
    if (threadIdx.x == 0) kl_out[row] = kl;
    for (int64_t g = threadIdx.x; g < p.nI; g += kThreads) {  // G_g into dqI, then dqI_g = w_g G_g, dw_g
      float* G = dqI + g * p.dI;
      for (int64_t c = 0; c < p.dI; ++c) G[c] = 0.f;
      float dwg = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t e = cand(i);
        const float sg = index_dot(p, row, g, e);
        if (!(sg > 0.f)) continue;
        dwg += buf[i] * sg;
        const int64_t k = (bb * p.n_e + e) * p.dI;
        for (int64_t c = 0; c < p.dI; ++c) G[c] += buf[i] * input_at(p.kI, k + c, p.dtype == DType::bf16);
      }
      const float wg = p.w[row * p.nI + g];
      for (int64_t c = 0; c < p.dI; ++c) G[c] *= wg;
      dw[g] = dwg;
    }
    __syncthreads();  // buf, the shared list and shifts are the next row's
  }
}

template <bool kSparse>
__global__ void __launch_bounds__(kThreads) entries_kernel(KlP p, const double* logZ, const float* lseI_in) {
  HMLA_DYNAMIC_SHARED(float, sg);  // [nI] the index dots of the current row
  __shared__ float red[kThreads];
  for (int64_t ie = blockIdx.x; ie < p.b * p.n_e; ie += gridDim.x) {
    const int64_t bb = ie / p.n_e, e = ie % p.n_e;
    float* dk = p.dkI + ie * p.dI;
    for (int64_t c = threadIdx.x; c < p.dI; c += kThreads) dk[c] = 0.f;
    const int32_t st = p.ent_doc[ie];
    if (st == -1) continue;
    // Global positions, within this call's query rows [q_row0, q_row0 + sq).
    const int64_t t_lo = p.ent_last[ie] > p.q_row0 ? p.ent_last[ie] : p.q_row0;
    const int64_t t_hi = p.doc_end[bb * p.s + st] < p.q_row0 + p.sq ? p.doc_end[bb * p.s + st] : p.q_row0 + p.sq;
    for (int64_t t = t_lo; t < t_hi; ++t) {  // every row here sees e
      const int64_t row = bb * p.sq + t - p.q_row0;
      const double lz = logZ[row];
      const float gr = finite(lz) ? p.coeff * p.row_weight[row] : 0.f;
      if (gr == 0.f) continue;  // block-uniform
      if constexpr (kSparse) {
        float listed = 0.f;
        for (int64_t i = threadIdx.x; i < p.K; i += kThreads) listed = p.topk[row * p.K + i] == e ? 1.f : listed;
        if (block_max<kThreads>(listed, red) == 0.f) continue;
      }
      float P = 0.f;
      for (int64_t h = threadIdx.x; h < p.H; h += kThreads)
        P += expf(logit(p, row, h, e) - shift_of(p.lse[(bb * p.H + h) * p.sq + t - p.q_row0], lz));
      P = block_sum<kThreads>(P, red);
      for (int64_t g = threadIdx.x; g < p.nI; g += kThreads) sg[g] = index_dot(p, row, g, e);
      __syncthreads();
      float I = 0.f;
      for (int64_t g = 0; g < p.nI; ++g) I = fmaf(p.w[row * p.nI + g], sg[g] > 0.f ? sg[g] : 0.f, I);
      const float dI = gr * (expf(I - lseI_in[row]) - P);
      for (int64_t c = threadIdx.x; c < p.dI; c += kThreads) {
        float acc = 0.f;
        for (int64_t g = 0; g < p.nI; ++g)
          if (sg[g] > 0.f)
            acc += dI * p.w[row * p.nI + g] * input_at(p.qI, (row * p.nI + g) * p.dI + c, p.dtype == DType::bf16);
        dk[c] += acc;
      }
      __syncthreads();  // sg is the next row's
    }
  }
}

__global__ void kl_sum_kernel(const float* rw, const float* kl, int64_t rows, double* acc) {
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum += double(rw[r]) * double(kl[r]);
  *acc += sum;
}

template <bool kSparse>
void run(const KlP& p, const char* what) {
  const int64_t rows = p.b * p.sq;
  if (p.b * p.s == 0) return;
  Scratch<double> logZ(rows);
  Scratch<float> lseI(rows), kl(rows);
  const int64_t n_max = kSparse ? p.K : p.n_e;
  const int64_t blocks = rows < KT::kMaxBlocks ? rows : KT::kMaxBlocks;
  Scratch<float> buf(blocks * n_max);
  const size_t smem = size_t(p.H) * 4 + (kSparse ? size_t(p.K) * 5 : 0);
  if (rows > 0) {  // no query rows: dkI still 0 (the entries kernel)
    HMLA_LAUNCH(rows_kernel<kSparse>, unsigned(blocks), kThreads, smem, stream(), p, buf.get(), n_max, logZ.get(),
                lseI.get(), kl.get());
    check_launch(what);
  }
  const int64_t ne = p.b * p.n_e;
  if (ne > 0) {
    HMLA_LAUNCH(entries_kernel<kSparse>, unsigned(ne < KT::kMaxBlocks ? ne : KT::kMaxBlocks), kThreads,
                size_t(p.nI) * 4, stream(), p, logZ.get(), lseI.get());
    check_launch(what);
  }
  HMLA_LAUNCH(kl_sum_kernel, 1, 1, 0, stream(), p.row_weight, kl.get(), rows, p.kl_acc);
  check_launch(what);
}

}  // namespace

void compressed_index_kl_dense(const CompressedIndexKlParams& p) { run<false>(p, "compressed_index_kl_dense"); }
void compressed_index_kl_sparse(const CompressedIndexKlParams& p) { run<true>(p, "compressed_index_kl_sparse"); }

// The plan (cuda_kernels.h): f32 or bf16 inputs (widened), H and K within the shared memory above.
Plan plan(Op op, const CompressedIndexKlParams& p) {
  const char* name = op == Op::compressed_index_kl_sparse ? "compressed_index_kl_sparse" : "compressed_index_kl_dense";
  if (p.H > KT::kMaxH)
    return {Variant::none, std::string(name) + ": H = " + std::to_string(p.H) + " above " + std::to_string(KT::kMaxH)};
  if (op == Op::compressed_index_kl_sparse && p.K > KT::kMaxK)
    return {Variant::none, std::string(name) + ": K = " + std::to_string(p.K) + " above " + std::to_string(KT::kMaxK) +
                               " (the SIMT kernel's shared memory)"};
  if (p.b * p.sq >= (int64_t(1) << 31)) return {Variant::none, std::string(name) + ": more than 2^31 query rows"};
  return {Variant::simt, {}};
}

}  // namespace hmla::cuda
