// The CPU backend: every op in f32 on host memory, through the kernels of cpu_kernels.h.
#include "hmla/ops/backend.h"

#include "cpu_kernels.h"

namespace hmla {

namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() : Backend(Device::cpu) {}
  const char* name() const override { return "cpu"; }

  bool supports(const GemmParams& p) const override {
    return p.a_dtype == DType::f32 && p.b_dtype == DType::f32 && p.c_dtype == DType::f32;
  }
  // f32 only: bf16 activations are CUDA's (nn.h); the CPU math stays the f32 reference.
  bool supports(const NormParams& p) const override {
    return p.x_dtype == DType::f32 && p.x2_dtype == DType::f32 && p.y_dtype == DType::f32;
  }
  bool supports(const RopeParams& p) const override { return p.x_dtype == DType::f32; }
  bool supports(const SwigluParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const EmbeddingParams&) const override { return true; }
  bool supports(const CrossEntropyParams&) const override { return true; }
  bool supports(const AxpyParams&) const override { return true; }
  bool supports(const ConvertParams& p) const override {
    auto fb = [](DType t) { return t == DType::f32 || t == DType::bf16; };
    return p.src_dtype == p.dst_dtype || (fb(p.src_dtype) && fb(p.dst_dtype));
  }
  bool supports(const SumSquaresParams&) const override { return true; }
  bool supports(const StatsParams&) const override { return true; }
  bool supports(const AdamWParams&) const override { return true; }
  bool supports(const MuonParams&) const override { return true; }
  bool supports(const AttnDenseParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const AttnSparseParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const IndexerTopkParams& p) const override { return p.dtype == DType::f32; }
  bool supports(const IndexerKlParams& p) const override {
    return p.dtype == DType::f32 && p.qk_dtype == DType::f32;
  }
  bool supports(const MoeRouteParams&) const override { return true; }
  bool supports(const MoeDispatchParams&) const override { return true; }
  bool supports(const MoeBalanceParams&) const override { return true; }
  bool supports(const MoeRowsParams& p) const override {
    return p.src_dtype == DType::f32 && p.a_dtype == DType::f32 && p.b_dtype == DType::f32;
  }
  bool supports(const MoeGroupedParams& p) const override {
    return p.x_dtype == DType::f32 && p.w_dtype == DType::f32 && p.y_dtype == DType::f32 && p.dx_dtype == DType::f32;
  }

#define HMLA_CPU_ENTRY(ret, name, P) HMLA_FORWARD(cpu, ret, name, P)
  HMLA_OP_LIST(HMLA_CPU_ENTRY)
#undef HMLA_CPU_ENTRY
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend b;
  return b;
}

}  // namespace hmla
