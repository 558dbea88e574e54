// The CUDA sparse latent MQA forward and backward (H a multiple of 16) against the CPU references (the bf16 rule of
// attn_cuda_check.h: twice a naive bf16 implementation's error against the float64 oracle plus the
// kernel's own final rounding; bit-identical reruns), and the device-side table check (a duplicate
// or an out-of-range key is a clear error). Shared by the gtest suite and hmla_cuda_check.
#pragma once
#include <cstdint>
#include <string>

#include <vector>

#include "hmla/core/allocator.h"
#include "op_cases.h"

namespace hmla::cuda_check {

using SparseCase = op_cases::AttnSparseCase;

// The rows of the sparse attention's case table (op_cases.h) the CUDA backend runs, forward and
// backward, on bf16 inputs: what its supports() answers for each row's params (case_support.h;
// the backward needs H a multiple of 16).
std::vector<SparseCase> sparse_cases();

struct SparseResult {
  std::string name;
  bool ok = false, deterministic = false;
  double out_err = 0, out_bound = 0, lse_err = 0, lse_bound = 0, lse_c_err = 0, lse_c_bound = 0;
  double dq_err = 0, dq_bound = 0, dkv_err = 0, dkv_bound = 0, dsink_err = 0, dsink_bound = 0;  // backward
  std::string json() const;
};

// dev = cpu runs the f32 CPU kernel on the same bf16-valued inputs (the harness's self-test);
// scale_factor != 1 perturbs the kernel's scale, bwd_factor != 1 the grad_output only the kernel sees
// (a wrong forward, a wrong backward: each must fail).
SparseResult check_sparse(const SparseCase& c, uint64_t seed, Device dev = Device::cuda, float scale_factor = 1.f,
                          float bwd_factor = 1.f);
// True when a table listing a key twice is refused with an hmla error on the device.
bool sparse_rejects_duplicates();

// Sparse MLA forward and forward+backward on one causal document: row t lists K keys evenly spread over [0, t] (all of
// them while t < K; the rest -1), the shape of the torch baseline (tests/cuda/torch_attention_bench.py
// builds the same table). FLOPs count valid slots only: 2 (Dqk + Dv) per listed (row, key) and head.
struct SparseBench {
  int64_t s, H, K, Dqk, Dv, valid_pairs = 0;
  double fwd_ms = 0, fwdbwd_ms = 0, fwd_tflops = 0, bwd_tflops = 0;  // bwd: 2.5x the forward's FLOPs
  int64_t peak_bytes = 0;
  std::string json() const;
};
SparseBench bench_sparse(int64_t s, int64_t H, int64_t K, int reps);

// The sparse backward's dkv workspace set to `bytes` for the scope (cuda::set_sparse_bwd_workspace_bytes):
// 1 runs the backward a row at a time.
class ScopedSparseBwdWorkspace {
 public:
  explicit ScopedSparseBwdWorkspace(int64_t bytes);
  ~ScopedSparseBwdWorkspace();
  ScopedSparseBwdWorkspace(const ScopedSparseBwdWorkspace&) = delete;
  ScopedSparseBwdWorkspace& operator=(const ScopedSparseBwdWorkspace&) = delete;

 private:
  int64_t previous_;
};

}  // namespace hmla::cuda_check
