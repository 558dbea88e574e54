// The CUDA backend's kernels and plans, all declared here (one kernel per op of op_list.h, one plan
// per params struct, each family's in its own .cu: dense attention attn_dense_fwd.cu /
// attn_dense_bwd.cu (and cuDNN's, attn_cudnn.cpp), sparse latent MQA attn_sparse_fwd.cu /
// attn_sparse_bwd.cu, the indexer's selection indexer_topk.cu and KLs indexer_kl.cu (the plan and
// the dispatch; the paths: indexer_kl_simt.cu, indexer_kl_mma.cu, indexer_kl_sparse.cu), products
// gemm.cu (cuBLASLt), the dense ops nn.cu, the optimizer steps optim.cu, the MoE ops moe.cu and
// moe_balance.cu). The backend (backend.cu) asks a family's plan, then calls its kernel with
// validated params; the kernel's launcher runs the variant the same plan names. Limits: traits.h.
#pragma once
#include <cstdint>
#include <vector>

#include "hmla/ops/op_list.h"

namespace hmla::cuda {

HMLA_OP_LIST(HMLA_DECLARE_KERNEL)
HMLA_PARAMS_LIST(HMLA_DECLARE_PLAN)
inline bool f32_or_bf16(DType t) { return t == DType::f32 || t == DType::bf16; }

// The sparse backward's dkv workspace budget in bytes (SparseTraits::kBwdWorkspaceBytes until set):
// a test seam, through which the tests run the backward in many chunks. Returns the previous one.
int64_t set_sparse_bwd_workspace_bytes(int64_t bytes);

// DeepSeek-V4's attention core on the tensor cores (attn_compressed_mma.cu, attn_compressed_mma_bwd.cu;
// bf16, CompressedMmaTraits::mma): what attn_compressed_fwd / _bwd run where their plan says mma.
void attn_compressed_fwd_mma(const AttnCompressedParams& p);
void attn_compressed_bwd_mma(const AttnCompressedParams& p);
// Its key-gradient workspace budget in bytes (CompressedMmaTraits::kBwdWorkspaceBytes until set): a
// test seam, as set_sparse_bwd_workspace_bytes (1: a row per chunk). Returns the previous one.
int64_t set_attn_compressed_bwd_workspace_bytes(int64_t bytes);

// The sparse indexer KL on the tensor cores (indexer_kl_sparse.cu; bf16 qI, kI, q, k,
// IndexerKlTraits::mma_sparse): dqI, dkI, dw and kl per row [b * sq] (the caller sums the loss).
void indexer_kl_sparse_mma(const IndexerKlParams& p, float* kl);
// Its dkI workspace budget in bytes (IndexerKlTraits::kSpWorkspaceBytes until set): a test seam, as
// set_sparse_bwd_workspace_bytes. Returns the previous one.
int64_t set_indexer_kl_workspace_bytes(int64_t bytes);

// The sparse backward's inverse index of the rows [r0, r0 + nr) as its device builder makes it
// (attn_sparse_bwd.cu), read back: per key k = batch * skv + j, entries[offsets[k] .. offsets[k + 1])
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
