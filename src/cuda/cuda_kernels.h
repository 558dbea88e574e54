// The CUDA backend's kernels, all declared here (the attention kernels on bf16 tensors with f32
// statistics, the rest f32); the
// backend (backend.cu) calls them with validated params. Shape limits are in CudaBackend::supports.
#pragma once
#include <cstdint>

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

}  // namespace hmla::cuda
