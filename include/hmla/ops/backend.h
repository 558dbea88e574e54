// One backend per device (ggml's backend interface, in C++): the device's memory (its allocator,
// copies, synchronisation) and its op entries, each taking the op family's params struct. The
// entry points of include/hmla/ops validate their tensors, fill the params, ask
// `supports(params)` and call the entry of backend(device). A backend overrides the ops it runs;
// the others report unsupported and throw if called.
//
// Backends: the CPU (f32, always), CUDA (bf16, in CUDA builds) and the SIMT-emulated CUDA (the
// CUDA sources compiled for the CPU; tests/cuda/emu). Adding an op: docs/ops.md.
#pragma once
#include <cstddef>

#include "hmla/core/allocator.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/indexer.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla {

class Backend {
 public:
  explicit Backend(Device d) : device_(d) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  Device device() const { return device_; }
  virtual const char* name() const = 0;

  // Memory: the device's allocator (exact live/peak counters), copies and synchronisation.
  Allocator& memory() const { return allocator(device_); }
  void synchronize() const { memory().synchronize(); }

  // Whether the backend runs the op on these params (dtype, widths).
  virtual bool supports(const GemmParams&) const { return false; }
  virtual bool supports(const NormParams&) const { return false; }
  virtual bool supports(const RopeParams&) const { return false; }
  virtual bool supports(const SwigluParams&) const { return false; }
  virtual bool supports(const EmbeddingParams&) const { return false; }
  virtual bool supports(const CrossEntropyParams&) const { return false; }
  virtual bool supports(const AxpyParams&) const { return false; }
  virtual bool supports(const ConvertParams&) const { return false; }
  virtual bool supports(const SumSquaresParams&) const { return false; }
  virtual bool supports(const AdamWParams&) const { return false; }
  virtual bool supports(const MuonParams&) const { return false; }
  virtual bool supports(const AttnDenseParams&) const { return false; }
  virtual bool supports(const AttnSparseParams&) const { return false; }
  virtual bool supports(const IndexerParams&) const { return false; }

  // Op entries, called with validated params.
  virtual void gemm(const GemmParams& p) const;
  virtual void rmsnorm_fwd(const NormParams& p) const;
  virtual void rmsnorm_bwd(const NormParams& p) const;
  virtual void layernorm_fwd(const NormParams& p) const;
  virtual void layernorm_bwd(const NormParams& p) const;
  virtual void rope(const RopeParams& p) const;
  virtual void swiglu_fwd(const SwigluParams& p) const;
  virtual void swiglu_bwd(const SwigluParams& p) const;
  virtual void embedding_fwd(const EmbeddingParams& p) const;
  virtual void embedding_bwd(const EmbeddingParams& p) const;
  virtual double cross_entropy(const CrossEntropyParams& p) const;
  virtual void axpy(const AxpyParams& p) const;
  virtual void convert(const ConvertParams& p) const;
  virtual double sum_squares(const SumSquaresParams& p) const;
  virtual void adamw_update(const AdamWParams& p) const;
  virtual void muon_momentum(const MuonParams& p) const;
  virtual void muon_update(const MuonParams& p) const;
  virtual void attn_dense_fwd(const AttnDenseParams& p) const;
  virtual void attn_dense_bwd(const AttnDenseParams& p) const;
  // The table's contract (entries in [-1, skv), no duplicate in a row): throws ShapeError.
  virtual void attn_sparse_check_table(const AttnSparseParams& p) const;
  virtual void attn_sparse_fwd(const AttnSparseParams& p) const;
  virtual void attn_sparse_bwd(const AttnSparseParams& p) const;
  virtual void indexer_topk(const IndexerParams& p) const;
  virtual void indexer_select(const IndexerParams& p) const;
  // The KLs return kl_sum (without coeff) and overwrite dqI, dkI, dw with the loss's gradients.
  virtual double indexer_kl_dense(const IndexerParams& p) const;
  virtual double indexer_kl_sparse(const IndexerParams& p) const;

 private:
  Device device_;
};

// The backend of a device; throws hmla::Error naming the device when this build has none.
const Backend& backend(Device d);

// Each backend's instance (src/cpu/backend.cpp, src/cuda/backend.cu); the CUDA one is null in a
// build without CUDA (src/ops/no_cuda.cpp).
const Backend& cpu_backend();
const Backend* cuda_backend();

}  // namespace hmla
