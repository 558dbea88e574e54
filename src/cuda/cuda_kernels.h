// The CUDA backend's kernels, all declared here (the attention kernels on bf16 tensors with f32
// statistics, the rest f32); the
// backend (backend.cu) calls them with validated params. Shape limits are in CudaBackend::supports.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/op_list.h"
#include "hmla/ops/optim.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla::cuda {

// One kernel per op of op_list.h, taking the op's params: dense attention (attn_dense_fwd.cu,
// attn_dense_bwd.cu), sparse latent MQA (attn_sparse.cu; the table check on the device), the
// indexer's selection (indexer_topk.cu) and fused KLs (indexer_kl.cu: f32, no [s, s] buffer),
// products (gemm.cu: f32 tensors into bf16 tensor-core math with f32 accumulation, cuBLASLt), the
// dense ops and optimizer steps (nn.cu: f32, deterministic). Shape limits: CudaBackend::supports
// (backend.cu) from traits.h, checked before any of these runs.
HMLA_OP_LIST(HMLA_DECLARE_KERNEL)

// The sparse backward's dkv workspace budget in bytes (SparseTraits::kBwdWorkspaceBytes until set):
// a test seam, through which the tests run the backward in many chunks. Returns the previous one.
int64_t set_sparse_bwd_workspace_bytes(int64_t bytes);

// The sparse indexer KL on the tensor cores (indexer_kl_sparse.cu; bf16 qI, kI, q, k,
// IndexerKlTraits::mma_sparse): dqI, dkI, dw and kl per row [b * sq] (the caller sums the loss).
void indexer_kl_sparse_mma(const IndexerKlParams& p, float* kl);
// Its dkI workspace budget in bytes (IndexerKlTraits::kSpWorkspaceBytes until set): a test seam, as
// set_sparse_bwd_workspace_bytes. Returns the previous one.
int64_t set_indexer_kl_workspace_bytes(int64_t bytes);

// The sparse backward's inverse index of the rows [r0, r0 + nr) as its device builder makes it
// (attn_sparse.cu), read back: per key k = batch * skv + j, entries[offsets[k] .. offsets[k + 1])
// = local row * KW + position (compact order: listed candidates, then listed window keys) for each
// row listing j, in (row, position) order. A test seam; the backward itself never reads it back.
struct SparseInverseIndex {
  std::vector<int64_t> offsets, entries;  // [b * skv + 1], [offsets.back()]
};
SparseInverseIndex sparse_inverse_index(const AttnSparseParams& p, int64_t r0, int64_t nr);

// Whether the E pointers of `table` lie at one stride (the experts' matrices in their arena), and
// that stride in elements of elem_bytes: the grouped products address expert e's matrix as
// table[0] + e * stride on the device, so no pointer table is uploaded (moe.cu).
bool moe_expert_stride(const void* const* table, int64_t E, int64_t elem_bytes, int64_t& stride);

}  // namespace hmla::cuda
