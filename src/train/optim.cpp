// AdamW (decoupled weight decay) and Muon (momentum, Nesterov, quintic Newton-Schulz
// orthogonalisation, update RMS matched to AdamW by 0.2 sqrt(max(rows, cols))).
#include "hmla/train/optim.h"

#include <cmath>
#include <numbers>

#include "hmla/model/v4_tables.h"
#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"

namespace hmla {

namespace {

bool uses_muon(const OptimSettings& o, const ParamSpec& p) {
  return o.optimizer == "muon" && p.shape.size() == 2 && p.name != "model.embed_tokens.weight" &&
         p.name != "lm_head.weight";
}

// The group's sum of squares into its stats slot: one running sum over the group's tensors, in
// table order, on the device.
void group_sum_squares(const std::vector<ParamSpec>& table, const io::TensorMap& g, bool indexer, const Tensor& acc) {
  for (const ParamSpec& p : table)
    if (is_indexer_tensor(p.name) == indexer) sum_squares_into(g.at(p.name), acc);
}

// X <- approximately U V^T of G = U S V^T: quintic Newton-Schulz iterations on G / |G|_F, on the
// wide orientation (rows <= cols), written into `out` (G's shape).
void newton_schulz(const Tensor& G, int steps, Tensor out) {
  const int64_t rows = G.size(0), cols = G.size(1);
  const bool tr = rows > cols;  // iterate on the wide orientation
  const int64_t r = tr ? cols : rows, c = tr ? rows : cols;
  const Device dev = G.device();
  Tensor X = Tensor::empty({r, c}, DType::f32, dev), A = Tensor::empty({r, r}, DType::f32, dev),
         B = Tensor::empty({r, r}, DType::f32, dev), Gs = Tensor::empty({rows, cols}, DType::f32, dev);
  const Tensor ss = Tensor::zeros({1}, DType::f64, dev);  // G / (|G|_F + 1e-7), |G| on the device
  sum_squares_into(G, ss);
  muon_normalize(G, ss, Gs);
  X.copy_from(tr ? Gs.transpose(0, 1) : Gs);
  const float a = 3.4445f, b = -4.7750f, cc = 2.0315f;
  for (int k = 0; k < steps; ++k) {
    matmul(X, Trans::no, X, Trans::yes, A);                 // A = X X^T
    matmul(A, Trans::no, A, Trans::no, B, cc);              // B = cc A A + b A
    axpy(B, b, A, B);
    const Tensor Y = X.clone();
    matmul(B, Trans::no, Y, Trans::no, X, 1.f, a);          // X = a X + B X
  }
  out.copy_from(tr ? X.transpose(0, 1) : X);
}

}  // namespace

bool is_indexer_tensor(const std::string& name) { return name.find("indexer.") != std::string::npos; }

double lr_at(const OptimSettings& o, double base, int64_t step) {
  if (step < o.warmup_steps) return base * double(step + 1) / double(o.warmup_steps);
  const double span = double(std::max<int64_t>(o.total_steps - o.warmup_steps, 1));
  const double p = std::min(1.0, double(step - o.warmup_steps) / span);
  return base * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * p)));
}

Optimizer::Optimizer(const Model& m, const OptimSettings& o, bool indexer_only, bool train_mtp)
    : o_(o), indexer_only_(indexer_only), train_mtp_(train_mtp), table_(m.table) {
  HMLA_CHECK(o.optimizer == "adamw" || o.optimizer == "muon", ConfigError, "optimizer '", o.optimizer,
             "': use adamw or muon");
  m_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32, m.device());
  v_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32, m.device());
  m_ = arena_views(table_, m_arena_);
  v_ = arena_views(table_, v_arena_);
}

OptimStats Optimizer::step(Model& m, io::TensorMap& grads, int64_t step) {
  const Tensor stats = Tensor::zeros({kStatCount}, DType::f64, m.device());
  launch_step(m, grads, step, stats, Tensor::zeros({1}, DType::f32, m.device()));
  return stats_of(stats.to_vector<double>(), step);
}

void Optimizer::launch_step(Model& m, io::TensorMap& grads, int64_t step, const Tensor& stats, const Tensor& bad) {
  auto slot = [&stats](StatSlot k) { return stats.slice(0, k, k + 1); };
  group_sum_squares(table_, grads, false, slot(kStatSsBackbone));
  group_sum_squares(table_, grads, true, slot(kStatSsIndexer));
  // The norms, the clip scales and the gate on the device: with a non-finite loss (bad) or norm
  // every update below leaves weights and moments as they were, so a non-finite gradient never
  // reaches the parameters although the host learns of it only after the launches.
  stats_clip(stats, bad, o_.clip_backbone, o_.clip_indexer);
  const double t = double(step + 1);
  const double bc1 = 1 - std::pow(o_.beta1, t), bc2 = 1 - std::pow(o_.beta2, t);
  for (const ParamSpec& p : table_) {
    const bool idx = is_indexer_tensor(p.name);
    if (indexer_only_ && !idx) continue;
    if (is_router_bias(p.name)) continue;  // not a gradient parameter (DESIGN.md section 9)
    if (!train_mtp_ && is_mtp_tensor(p.name)) continue;  // frozen where the phase trains no MTP loss
    const StatSlot gscale = idx ? kStatScaleIndexer : kStatScaleBackbone;
    const float lr = float(lr_at(o_, idx ? o_.indexer_lr : o_.lr, step));
    const Tensor &w = m.params.at(p.name), &g = grads.at(p.name), &mm = m_.at(p.name);
    if (uses_muon(o_, p)) {
      Tensor u = Tensor::empty(p.shape, DType::f32, w.device()), upd = Tensor::empty(p.shape, DType::f32, w.device());
      muon_momentum(g, mm, u, 1.f, float(o_.muon_momentum), stats, gscale);
      newton_schulz(u, o_.muon_ns_steps, upd);
      const float scale_ = 0.2f * std::sqrt(float(std::max(p.shape[0], p.shape[1])));
      muon_update(w, upd, lr, scale_, float(o_.weight_decay), stats);
      continue;
    }
    AdamWParams h;
    h.lr = lr, h.b1 = float(o_.beta1), h.b2 = float(o_.beta2), h.eps = float(o_.eps);
    h.wd = p.shape.size() == 2 ? float(o_.weight_decay) : 0.f;  // no decay on norms, biases and the sink
    h.bc1 = bc1, h.bc2 = bc2;
    adamw_update(w, g, mm, v_.at(p.name), h, stats, gscale);
  }
  refresh_compute_weights(m);  // the products' copy, once per step (DESIGN.md section 4)
}

OptimStats Optimizer::stats_of(const std::vector<double>& s, int64_t step) const {
  OptimStats st;
  st.grad_norm_backbone = s.at(kStatNormBackbone);
  st.grad_norm_indexer = s.at(kStatNormIndexer);
  // The device's gate kept every weight where it was (launch_step).
  HMLA_CHECK(std::isfinite(st.grad_norm_backbone), DivergenceError, "the backbone's gradient norm is ",
             st.grad_norm_backbone);
  HMLA_CHECK(std::isfinite(st.grad_norm_indexer), DivergenceError, "the indexers' gradient norm is ",
             st.grad_norm_indexer);
  st.lr = lr_at(o_, o_.lr, step);
  return st;
}

io::TensorMap Optimizer::state() const { return {{"optimizer.m", m_arena_}, {"optimizer.v", v_arena_}}; }

void Optimizer::load_state(const io::TensorMap& s, const std::string& what) {
  for (const char* name : {"optimizer.m", "optimizer.v"}) {
    auto it = s.find(name);
    HMLA_CHECK(it != s.end() && it->second.numel() == m_arena_.numel() && it->second.dtype() == DType::f32, IoError,
               what, ": optimizer state '", name, "' is missing or does not match the model");
  }
  m_arena_.copy_from(s.at("optimizer.m").view({m_arena_.numel()}));
  v_arena_.copy_from(s.at("optimizer.v").view({v_arena_.numel()}));
}

}  // namespace hmla
