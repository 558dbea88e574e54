// The dense SwiGLU MLP (mlp.h): y = down(silu(gate(x)) * up(x)); it keeps g = gate(x), u = up(x)
// and act = silu(g) * u [N, intermediate_size].
#include "hmla/model/mlp.h"

#include "hmla/ops/nn.h"

namespace hmla {

namespace {

class DenseMlp final : public Mlp {
 public:
  DenseMlp(const ModelConfig& c, const LayerTensors& w, const LayerTensors* g) : I_(c.intermediate_size), w_(w), g_(g) {}

  std::vector<ActField> fields() const override { return {{"g", I_}, {"u", I_}, {"act", I_}}; }

  void forward(const Tensor& x, const std::vector<Tensor>& sv, const Tensor& y) const override {
    linear_fwd(x, w_.gate_proj, sv[kG]);
    linear_fwd(x, w_.up_proj, sv[kU]);
    swiglu_fwd(sv[kG], sv[kU], sv[kAct]);
    linear_fwd(sv[kAct], w_.down_proj, y);
  }

  void backward(const Tensor& dy, const Tensor& x, const std::vector<Tensor>& sv, const Tensor& dx) const override {
    const int64_t N = x.numel() / x.size(-1);
    auto tmp = [&](const Shape& sh) { return Tensor::empty(sh, DType::f32, x.device()); };
    Tensor dact = tmp({N, I_}), dg = tmp({N, I_}), du = tmp({N, I_});
    linear_bwd(dy, sv[kAct], w_.down_proj, g_->down_proj, dact);
    swiglu_bwd(dact, sv[kG], sv[kU], dg, du);
    linear_bwd(dg, x, w_.gate_proj, g_->gate_proj, dx);
    linear_bwd(du, x, w_.up_proj, g_->up_proj, dx, 1.f);
  }

 private:
  enum { kG, kU, kAct };  // fields()' order
  int64_t I_;
  const LayerTensors& w_;
  const LayerTensors* g_;
};

}  // namespace

std::unique_ptr<Mlp> make_mlp(const ModelConfig& c, int64_t L, const LayerTensors& w, const LayerTensors* g) {
  (void)L;  // every layer is dense until MoE layers land (build_model refuses them)
  return std::make_unique<DenseMlp>(c, w, g);
}

}  // namespace hmla
