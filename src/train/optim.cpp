// AdamW (decoupled weight decay) and Muon (momentum, Nesterov, quintic Newton-Schulz
// orthogonalisation, update RMS matched to AdamW by 0.2 sqrt(max(rows, cols))).
#include "hmla/train/optim.h"

#include <cmath>
#include <numbers>

#include "cpu_kernels.h"

namespace hmla {

namespace {

bool uses_muon(const OptimSettings& o, const ParamSpec& p) {
  return o.optimizer == "muon" && p.shape.size() == 2 && p.name != "model.embed_tokens.weight" &&
         p.name != "lm_head.weight";
}

double group_norm(const std::vector<ParamSpec>& table, const io::TensorMap& g, bool indexer) {
  double ss = 0;
  for (const ParamSpec& p : table) {
    if (is_indexer_tensor(p.name) != indexer) continue;
    const Tensor& t = g.at(p.name);
    const float* x = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) ss += double(x[i]) * x[i];
  }
  return std::sqrt(ss);
}

// X <- approximately U V^T of G = U S V^T: five quintic Newton-Schulz iterations on G / |G|_F.
void newton_schulz(const float* G, int64_t rows, int64_t cols, int steps, float* out) {
  const bool tr = rows > cols;  // iterate on the wide orientation
  const int64_t r = tr ? cols : rows, c = tr ? rows : cols;
  std::vector<float> X(r * c), A(r * r), B(r * r), Y(r * c);
  double norm = 0;
  for (int64_t i = 0; i < rows * cols; ++i) norm += double(G[i]) * G[i];
  const float inv = float(1.0 / (std::sqrt(norm) + 1e-7));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) (tr ? X[j * c + i] : X[i * c + j]) = G[i * cols + j] * inv;
  const float a = 3.4445f, b = -4.7750f, cc = 2.0315f;
  for (int k = 0; k < steps; ++k) {
    cpu::sgemm(cpu::Trans::no, cpu::Trans::yes, r, r, c, 1.f, X.data(), c, X.data(), c, 0.f, A.data(), r);
    cpu::sgemm(cpu::Trans::no, cpu::Trans::no, r, r, r, cc, A.data(), r, A.data(), r, 0.f, B.data(), r);
    for (int64_t i = 0; i < r * r; ++i) B[i] += b * A[i];
    Y = X;
    cpu::sgemm(cpu::Trans::no, cpu::Trans::no, r, c, r, 1.f, B.data(), r, Y.data(), c, a, X.data(), c);
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = tr ? X[j * c + i] : X[i * c + j];
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
  m_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32);
  v_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32);
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
    float* w = m.params.at(p.name).data<float>();
    const float* g = grads.at(p.name).data<float>();
    float* mm = m_.at(p.name).data<float>();
    float* vv = v_.at(p.name).data<float>();
    const int64_t n = shape_numel(p.shape);
    const bool decay = p.shape.size() == 2;  // no decay on norms, biases and the sink
    if (uses_muon(o_, p)) {
      std::vector<float> u(n), upd(n);
      const float beta = float(o_.muon_momentum);
      for (int64_t i = 0; i < n; ++i) {
        mm[i] = beta * mm[i] + g[i] * gscale;
        u[i] = g[i] * gscale + beta * mm[i];  // Nesterov
      }
      newton_schulz(u.data(), p.shape[0], p.shape[1], o_.muon_ns_steps, upd.data());
      const float scale = 0.2f * std::sqrt(float(std::max(p.shape[0], p.shape[1])));
      for (int64_t i = 0; i < n; ++i) w[i] -= lr * (scale * upd[i] + float(o_.weight_decay) * w[i]);
      continue;
    }
    const float b1 = float(o_.beta1), b2 = float(o_.beta2), eps = float(o_.eps), wd = decay ? float(o_.weight_decay) : 0.f;
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * gscale;
      mm[i] = b1 * mm[i] + (1 - b1) * gi;
      vv[i] = b2 * vv[i] + (1 - b2) * gi * gi;
      const float mh = mm[i] / float(bc1), vh = vv[i] / float(bc2);
      w[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * w[i]);
    }
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
