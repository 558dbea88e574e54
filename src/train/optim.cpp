// AdamW (decoupled weight decay) and Muon (momentum, Nesterov, quintic Newton-Schulz
// orthogonalisation, update RMS matched to AdamW by 0.2 sqrt(max(rows, cols))).
#include "hmla/train/optim.h"

#include <cmath>
#include <numbers>

#include "hmla/ops/nn.h"
#include "hmla/ops/optim.h"

namespace hmla {

namespace {

bool uses_muon(const OptimSettings& o, const ParamSpec& p) {
  return o.optimizer == "muon" && p.shape.size() == 2 && p.name != "model.embed_tokens.weight" &&
         p.name != "lm_head.weight";
}

double group_norm(const std::vector<ParamSpec>& table, const io::TensorMap& g, bool indexer) {
  double ss = 0;  // one running sum over the group's tensors, in table order
  for (const ParamSpec& p : table)
    if (is_indexer_tensor(p.name) == indexer) ss = sum_squares(g.at(p.name), ss);
  return std::sqrt(ss);
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
  const float inv = float(1.0 / (std::sqrt(sum_squares(G)) + 1e-7));
  scale(G, inv, Gs);
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

Optimizer::Optimizer(const Model& m, const OptimSettings& o, bool indexer_only)
    : o_(o), indexer_only_(indexer_only), table_(m.table) {
  HMLA_CHECK(o.optimizer == "adamw" || o.optimizer == "muon", ConfigError, "optimizer '", o.optimizer,
             "': use adamw or muon");
  m_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32, m.device());
  v_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32, m.device());
  m_ = arena_views(table_, m_arena_);
  v_ = arena_views(table_, v_arena_);
}

OptimStats Optimizer::step(Model& m, io::TensorMap& grads, int64_t step) {
  OptimStats st;
  st.grad_norm_backbone = group_norm(table_, grads, false);
  st.grad_norm_indexer = group_norm(table_, grads, true);
  // Checked before any weight moves, so a non-finite gradient never reaches the parameters.
  HMLA_CHECK(std::isfinite(st.grad_norm_backbone), DivergenceError, "the backbone's gradient norm is ",
             st.grad_norm_backbone);
  HMLA_CHECK(std::isfinite(st.grad_norm_indexer), DivergenceError, "the indexers' gradient norm is ",
             st.grad_norm_indexer);
  const double t = double(step + 1);
  const double bc1 = 1 - std::pow(o_.beta1, t), bc2 = 1 - std::pow(o_.beta2, t);
  st.lr = lr_at(o_, o_.lr, step);
  for (const ParamSpec& p : table_) {
    const bool idx = is_indexer_tensor(p.name);
    if (indexer_only_ && !idx) continue;
    const double norm = idx ? st.grad_norm_indexer : st.grad_norm_backbone;
    const double clip = idx ? o_.clip_indexer : o_.clip_backbone;
    const float gscale = (clip > 0 && norm > clip) ? float(clip / norm) : 1.f;
    const float lr = float(lr_at(o_, idx ? o_.indexer_lr : o_.lr, step));
    const Tensor &w = m.params.at(p.name), &g = grads.at(p.name), &mm = m_.at(p.name);
    if (uses_muon(o_, p)) {
      Tensor u = Tensor::empty(p.shape, DType::f32, w.device()), upd = Tensor::empty(p.shape, DType::f32, w.device());
      muon_momentum(g, mm, u, gscale, float(o_.muon_momentum));
      newton_schulz(u, o_.muon_ns_steps, upd);
      const float scale_ = 0.2f * std::sqrt(float(std::max(p.shape[0], p.shape[1])));
      muon_update(w, upd, lr, scale_, float(o_.weight_decay));
      continue;
    }
    AdamWParams h;
    h.gscale = gscale, h.lr = lr, h.b1 = float(o_.beta1), h.b2 = float(o_.beta2), h.eps = float(o_.eps);
    h.wd = p.shape.size() == 2 ? float(o_.weight_decay) : 0.f;  // no decay on norms, biases and the sink
    h.bc1 = bc1, h.bc2 = bc2;
    adamw_update(w, g, mm, v_.at(p.name), h);
  }
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
