// The CUDA backend's kernels, all declared here (bf16 tensors on the device, f32 statistics); the
// backend (backend.cu) calls them with validated params. Shape limits are in CudaBackend::supports.
#pragma once
#include <cstdint>

#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla::cuda {

// Dense attention (attn_dense_fwd.cu, attn_dense_bwd.cu): Dqk and Dv multiples of 16 (the
// backward's dO V^T runs over Dv in k-steps of 16).
void attn_dense_fwd(const AttnDenseParams& p);
void attn_dense_bwd(const AttnDenseParams& p);

// Sparse latent MQA (attn_sparse.cu), into preallocated outputs; the table check runs on the device.
void attn_sparse_check_table(const AttnSparseParams& p);
void attn_sparse_fwd(const AttnSparseParams& p);
void attn_sparse_bwd(const AttnSparseParams& p);  // H a multiple of 16

// The indexer's scores and selection (indexer_topk.cu): HI and DI multiples of 16, K <= 2048.
void indexer_topk(const IndexerParams& p);
void indexer_select(const IndexerParams& p);

}  // namespace hmla::cuda
