// The op list: every backend entry, written once. From it come the Backend's virtual entries and
// their unsupported defaults (backend.h, backend_base.cpp), each backend's kernel declarations
// (cpu_kernels.h, cuda_kernels.h) and its overrides (src/cpu/backend.cpp, src/cuda/backend.cu),
// which forward to the kernel of the same name. An X-macro rather than a constexpr table because
// what it generates are declarations (ggml's one op enum does the same work with a switch).
//
//   X(return type, entry name, params struct)   (in the family's header, HMLA_<FAMILY>_OPS)
//
// One params struct per op family (fwd and bwd share theirs); supports(params) is declared once
// per struct by HMLA_PARAMS_LIST and is the only place a backend writes its limits. Adding an op:
// docs/ops.md.
#pragma once

#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "hmla/ops/sparse_attention.h"

// Each family's header lists its own ops next to its params structs (HMLA_<FAMILY>_OPS), so that
// an op of an existing family is one line in the header that declares its entry point.
#define HMLA_OP_LIST(X) \
  HMLA_NN_OPS(X) HMLA_OPTIM_OPS(X) HMLA_ATTN_DENSE_OPS(X) HMLA_ATTN_SPARSE_OPS(X) HMLA_INDEXER_OPS(X) \
  HMLA_MOE_OPS(X) HMLA_MOE_BALANCE_OPS(X)

#define HMLA_PARAMS_LIST(X)                                                                          \
  X(GemmParams) X(NormParams) X(RopeParams) X(SwigluParams) X(EmbeddingParams) X(CrossEntropyParams) \
  X(AxpyParams) X(ConvertParams) X(SumSquaresParams) X(StatsParams) X(AdamWParams) X(MuonParams) X(AttnDenseParams)  \
  X(AttnSparseParams) X(IndexerTopkParams) X(IndexerKlParams) X(MoeRouteParams) X(MoeDispatchParams) X(MoeRowsParams) \
  X(MoeBalanceParams) X(MoeGroupedParams)

// The kernel declarations of one backend's namespace: `ret name(const Params& p);` per op
// (cpu_kernels.h, cuda_kernels.h: HMLA_OP_LIST(HMLA_DECLARE_KERNEL)).
#define HMLA_DECLARE_KERNEL(ret, name, P) ret name(const P& p);
// A backend's overrides, each forwarding to the kernel of the same name in namespace ns:
// HMLA_OP_LIST(HMLA_CPU_ENTRY) with #define HMLA_CPU_ENTRY(r, n, P) HMLA_FORWARD(cpu, r, n, P).
#define HMLA_FORWARD(ns, ret, name, P) \
  ret name(const P& p) const override { return ns::name(p); }
