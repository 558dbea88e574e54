// The CUDA dense attention against the CPU references, and its benchmark: shared by the gtest
// suite (label gpu, skipped without a device) and hmla_cuda_check, the dependency-free binary
// scripts/device-check builds and runs on a GPU machine.
//
// Correctness rule (STYLE.md, in bf16): on the same bf16 inputs, the kernel's max error against the
// float64 oracle is at most twice the error of a naive bf16 implementation (scores, P, dP, dS and
// every output rounded to bf16, f32 sums: what a framework's math path does) plus the kernel's own
// final rounding: 2^-8 of the largest reference value for bf16 outputs, 8 f32 ulps for f32 ones,
// and for dsink (which reads the forward's stored bf16 output) what rounding the exact output to
// bf16 does to the exact dsink.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "hmla/core/allocator.h"
#include "hmla/ops/attention.h"
#include "op_cases.h"

namespace hmla::cuda_check {

using Case = op_cases::AttnDenseCase;

// The rows of the dense attention's case table (op_cases.h) the CUDA backend runs, forward and
// backward, on bf16 inputs: what its supports() answers for each row's params (case_support.h).
std::vector<Case> cases();

struct TensorErr {
  std::string name;
  double err = 0, naive_err = 0, bound = 0, max_ref = 0, vs_cpu = 0;
  bool ok = false;
};

struct CaseResult {
  std::string name;
  std::string backend;   // who ran it: hmla (the hand-written kernels) or cudnn
  std::string declined;  // backend cudnn only: why cuDNN does not take the case (then nothing ran)
  std::vector<TensorErr> tensors;
  bool deterministic = false;  // a second run gives the same bits
  bool ok = false;
  std::string json() const;
};

bool device_available();
// Runs the case on `dev`: the bf16 GPU kernels on Device::cuda; on Device::cpu the f32 CPU kernels
// on the same bf16-valued inputs (what the harness's own tests check the rule with).
// kernel_scale_factor != 1 only in the harness's self-test: a wrong kernel must fail. backend
// cudnn: cuDNN's fused attention, or, where it declines the case, a result saying why (ok).
CaseResult check_case(const Case& c, uint64_t seed, Device dev = Device::cuda, float kernel_scale_factor = 1.f,
                      AttnBackend backend = AttnBackend::hmla);

struct BenchShape {
  int64_t s, H, Dqk, Dv, docs;
  AttnBackend backend = AttnBackend::hmla;
};
struct BenchResult {
  BenchShape shape;
  double fwd_ms = 0, fwdbwd_ms = 0, fwd_tflops = 0, fwdbwd_tflops = 0;
  int64_t peak_bytes = 0;
  std::string declined;
  std::string json() const;
};
// Medians of `reps` timed runs after a warm-up, with CUDA events on hmla's stream. A shape whose
// backend (cudnn) declines it gives an empty result (fwd_ms 0) whose json says why.
BenchResult bench(const BenchShape& shape, int reps);

}  // namespace hmla::cuda_check
