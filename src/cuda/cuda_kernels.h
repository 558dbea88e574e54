// The CUDA backend's kernels, all declared here (the attention kernels on bf16 tensors with f32
// statistics, the rest f32); the
// backend (backend.cu) calls them with validated params. Shape limits are in CudaBackend::supports.
#pragma once
#include <cstdint>

#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
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

// The indexer's KLs (indexer_kl.cu): f32 qI, kI, q, k; fused, no [s, s] buffer.
double indexer_kl_dense(const IndexerParams& p);
double indexer_kl_sparse(const IndexerParams& p);

// Products (gemm.cu): f32 tensors, bf16 tensor-core math with f32 accumulation (cuBLASLt).
void gemm(const GemmParams& p);

// The dense ops and optimizer steps (nn.cu), f32, deterministic.
void rmsnorm_fwd(const NormParams& p);
void rmsnorm_bwd(const NormParams& p);
void layernorm_fwd(const NormParams& p);
void layernorm_bwd(const NormParams& p);
void rope(const RopeParams& p);
void swiglu_fwd(const SwigluParams& p);
void swiglu_bwd(const SwigluParams& p);
void embedding_fwd(const EmbeddingParams& p);
void embedding_bwd(const EmbeddingParams& p);
double cross_entropy(const CrossEntropyParams& p);
void axpy(const AxpyParams& p);
void convert(const ConvertParams& p);
double sum_squares(const SumSquaresParams& p);
void adamw_update(const AdamWParams& p);
void muon_momentum(const MuonParams& p);
void muon_update(const MuonParams& p);

}  // namespace hmla::cuda
