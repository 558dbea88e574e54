// The indexer's KL losses on the GPU (DESIGN.md section 6; the algebra and the passes of
// docs/indexer.md): the entry points, their plan and the dispatch by it over three paths, fused
// (nothing of size [s, s] exists) and deterministic (no atomics on floats, every sum in a fixed
// order): the dense KL on the tensor cores (indexer_kl_mma.cu), the sparse one on the tensor cores
// (indexer_kl_sparse.cu), and SIMT kernels in f32 math for the rest (indexer_kl_simt.cu).
// The loss sum_t rw[t] kl(t) is summed on the device in row order by one thread, as the CPU does.
// Speed: docs/cuda.md ("The indexer KL").
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_kernels.h"
#include "indexer_kl.cuh"
#include "runtime.h"
#include "traits.h"

namespace hmla::cuda {

namespace {

// One thread: *acc += (sum_r rw[r] kl[r] from 0, rows in order), as the CPU. rw and kl are f32, so
// each product is exact in f64 and a contracted multiply-add rounds as the separate ops do.
__global__ void kl_sum_kernel(const float* rw, const float* kl, int64_t rows, double* acc) {
  double sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum += double(rw[r]) * double(kl[r]);
  *acc += sum;
}

// The sparse KL on the tensor cores (indexer_kl_sparse.cu), then the loss.
void run_kl_sparse_mma(const IndexerKlParams& p) {
  const int64_t rows = p.b * p.sq;
  Scratch<float> kl(rows);
  indexer_kl_sparse_mma(p, kl.get());
  detail::kl_sum(p, kl.get(), rows);
}

template <bool kSparse>
void run_kl_typed(const IndexerKlParams& p) {
  if (plan(kSparse ? Op::indexer_kl_sparse : Op::indexer_kl_dense, p).variant == Variant::mma) {
    if constexpr (kSparse) return run_kl_sparse_mma(p);
    else return detail::kl_dense_mma(p);
  }
  detail::kl_simt<kSparse>(p);
}

}  // namespace

void detail::kl_sum(const IndexerKlParams& p, const float* kl, int64_t rows) {
  HMLA_LAUNCH(kl_sum_kernel, 1, 1, 0, current_stream().get(), p.row_weight, kl, rows, p.kl_acc);
  check_launch("indexer KL sum");
}

void indexer_kl_dense(const IndexerKlParams& p) { run_kl_typed<false>(p); }
void indexer_kl_sparse(const IndexerKlParams& p) { run_kl_typed<true>(p); }

// The plan of both KLs (cuda_kernels.h), which run_kl_typed follows: the tensor-core kernels for bf16
// inputs in their limits (IndexerKlTraits::mma_dense, mma_sparse), else the SIMT kernels for f32 or
// bf16 inputs up to kMaxHI index heads, kMaxH heads, K up to kMaxK and their shared memory.
Plan plan(Op op, const IndexerKlParams& p) {
  using T = IndexerKlTraits;
  const bool sparse = op == Op::indexer_kl_sparse;
  const bool bf16_inputs = p.dtype == DType::bf16 && p.qk_dtype == DType::bf16;
  if (!sparse && T::mma_dense(bf16_inputs, p.H, p.HI, p.Dqk, p.DI)) return {Variant::mma, {}};
  if (sparse && T::mma_sparse(bf16_inputs, p.H, p.HI, p.Dqk, p.DI, p.K)) return {Variant::mma, {}};
  const int64_t cand = sparse ? T::pow2_at_least(p.K) : 0;
  return plan_if(f32_or_bf16(p.dtype) && f32_or_bf16(p.qk_dtype) && p.HI <= T::kMaxHI && p.H <= T::kMaxH &&
                     p.K <= T::kMaxK && T::smem_bytes(p.HI, p.H, cand) <= T::kMaxSmemBytes,
                 Variant::simt);
}

}  // namespace hmla::cuda
