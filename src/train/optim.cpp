// AdamW (decoupled weight decay) and Muon (momentum, Nesterov, quintic Newton-Schulz
// orthogonalisation, update RMS matched to AdamW by 0.2 sqrt(max(rows, cols))).
#include "hmla/train/optim.h"

#include <cmath>
#include <map>
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

Optimizer::Optimizer(const Model& m, const OptimSettings& o, bool indexer_only, bool train_mtp, GradGroups groups)
    : o_(o), indexer_only_(indexer_only), train_mtp_(train_mtp), groups_(groups), ep_(m.ep), table_(m.table),
      full_table_(full_param_table(m)) {
  HMLA_CHECK(o.optimizer == "adamw" || o.optimizer == "muon", ConfigError, "optimizer '", o.optimizer,
             "': use adamw or muon");
  HMLA_CHECK(!groups_.shard || groups_.all, ConfigError, "a sharded optimizer needs the group its gradients are summed over");
  HMLA_CHECK(!m.ep || (groups_.all && groups_.experts), ConfigError,
             "a model whose experts are sharded needs the groups its gradients are summed over");
  if (!m.ep) groups_.experts = nullptr;
  const size_t first_expert = m.ep ? m.first_expert : table_.size();
  auto segment = [](Comm* comm, size_t first, size_t end) {
    Segment g;
    g.comm = comm, g.first = first, g.end = end;
    return g;
  };
  segs_.push_back(segment(groups_.all, 0, first_expert));
  if (groups_.experts) segs_.push_back(segment(groups_.experts, first_expert, table_.size()));
  for (Segment& g : segs_)
    for (size_t i = g.first; i < g.end; ++i) g.numel += shape_numel(table_[i].shape);
  if (!sharded()) {
    m_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32, m.device());
    v_arena_ = Tensor::zeros({m.arena.numel()}, DType::f32, m.device());
    m_ = arena_views(table_, m_arena_);
    v_ = arena_views(table_, v_arena_);
    return;
  }
  std::vector<ParamSpec> kept;  // the moments this rank keeps: its tensors that the phase updates
  int64_t at = 0;
  for (Segment& g : segs_) {
    const std::vector<ParamSpec> part(table_.begin() + ptrdiff_t(g.first), table_.begin() + ptrdiff_t(g.end));
    std::vector<bool> trained;
    for (const ParamSpec& p : part) trained.push_back(updates(p));
    g.plan = shard_plan(part, trained, g.comm->size(), g.comm->rank());
    g.at = at;
    at += g.plan.arena_numel();
    g.gshard = Tensor::zeros({g.plan.block}, DType::f32, m.device());
    const int64_t base = int64_t(g.plan.rank) * g.plan.block;
    for (size_t i = 0; i < part.size(); ++i) {
      if (!g.plan.mine(i)) continue;
      if (trained[i]) kept.push_back(part[i]);
      const int64_t from = g.plan.offset[i] - base;
      gowned_[part[i].name] = g.gshard.slice(0, from, from + shape_numel(part[i].shape)).view(part[i].shape);
    }
  }
  m_arena_ = Tensor::zeros({table_numel(kept)}, DType::f32, m.device());
  v_arena_ = Tensor::zeros({table_numel(kept)}, DType::f32, m.device());
  m_ = arena_views(kept, m_arena_);
  v_ = arena_views(kept, v_arena_);
}

bool Optimizer::updates(const ParamSpec& p) const {
  if (indexer_only_ && !is_indexer_tensor(p.name)) return false;
  if (is_router_bias(p.name)) return false;                   // not a gradient parameter (DESIGN.md section 9)
  return train_mtp_ || !is_mtp_tensor(p.name);                // frozen where the phase trains no MTP loss
}

OptimStats Optimizer::step(Model& m, io::TensorMap& grads, int64_t step) {
  HMLA_CHECK(!sharded(), Error, "Optimizer::step runs unsharded only: a sharded step is launch_sharded_step");
  const Tensor stats = Tensor::zeros({kStatCount}, DType::f64, m.device());
  launch_step(m, grads, step, stats, Tensor::zeros({1}, DType::f32, m.device()));
  return stats_of(stats.to_vector<double>(), step);
}

void Optimizer::allreduce_gradients(const Tensor& garena) {
  HMLA_CHECK(!sharded() && garena.numel() == table_numel(table_), Error,
             "allreduce_gradients needs an unsharded optimizer and a gradient arena of the model's table");
  int64_t at = 0;
  for (const Segment& g : segs_) {
    if (g.comm) g.comm->allreduce_sum(garena.data<float>() + at, g.numel, garena.device());
    at += g.numel;
  }
}

void Optimizer::launch_step(Model& m, io::TensorMap& grads, int64_t step, const Tensor& stats, const Tensor& bad) {
  HMLA_CHECK(!sharded(), Error, "a sharded optimizer steps by launch_sharded_step");
  auto slot = [&stats](StatSlot k) { return stats.slice(0, k, k + 1); };
  if (segs_.size() > 1) {  // expert parallelism: each rank's block's squares, summed over the EP group first
    const std::vector<ParamSpec> experts(table_.begin() + ptrdiff_t(segs_[1].first), table_.end());
    group_sum_squares(experts, grads, false, slot(kStatSsBackbone));
    group_sum_squares(experts, grads, true, slot(kStatSsIndexer));
    static_assert(kStatSsIndexer == kStatSsBackbone + 1, "the two sums of squares are one all-reduce");
    ep_->allreduce_sum(stats.data<double>() + kStatSsBackbone, 2, stats.device());
  }
  const std::vector<ParamSpec> replicated(table_.begin(), table_.begin() + ptrdiff_t(segs_[0].end));
  group_sum_squares(replicated, grads, false, slot(kStatSsBackbone));
  group_sum_squares(replicated, grads, true, slot(kStatSsIndexer));
  // The norms, the clip scales and the gate on the device: with a non-finite loss (bad) or norm
  // every update below leaves weights and moments as they were, so a non-finite gradient never
  // reaches the parameters although the host learns of it only after the launches.
  stats_clip(stats, bad, o_.clip_backbone, o_.clip_indexer);
  update(m, grads, step, stats);
  refresh_compute_weights(m);  // the products' copy, once per step (DESIGN.md section 4)
}

void Optimizer::launch_sharded_step(Model& m, const Tensor& garena, int64_t step, const Tensor& stats,
                                    const Tensor& bad) {
  HMLA_CHECK(sharded() && garena.numel() == grad_arena_numel(m), Error,
             "launch_sharded_step needs a sharded optimizer and its owner-ordered gradient arena");
  const Device dev = m.device();
  // Each value reaches its owner summed over its group (the sums that the unsharded all-reduce
  // makes, in the reduce-scatter's order), and only there.
  for (const Segment& g : segs_)
    g.comm->reduce_scatter_sum(garena.data<float>() + g.at, g.gshard.data<float>(), g.plan.block, dev);
  std::vector<ParamSpec> owned;
  for (const ParamSpec& p : table_)
    if (gowned_.count(p.name)) owned.push_back(p);
  auto slot = [&stats](StatSlot k) { return stats.slice(0, k, k + 1); };
  group_sum_squares(owned, gowned_, false, slot(kStatSsBackbone));
  group_sum_squares(owned, gowned_, true, slot(kStatSsIndexer));
  static_assert(kStatSsIndexer == kStatSsBackbone + 1, "the two sums of squares are one all-reduce");
  // The global norms' squares: every tensor has one owner in the whole grid (an expert's among the
  // ranks holding its block), so the owners' sums over the grid count each once.
  groups_.all->allreduce_sum(stats.data<double>() + kStatSsBackbone, 2, dev);
  stats_clip(stats, bad, o_.clip_backbone, o_.clip_indexer);                // the same gate on every rank
  update(m, gowned_, step, stats);
  // The owners' weights into their blocks (the gradients there are spent), gathered through the
  // arena into every rank's parameters: each rank ends the step holding its whole table.
  for (const ParamSpec& p : owned)
    if (updates(p)) gowned_.at(p.name).copy_from(m.params.at(p.name));
  for (const Segment& g : segs_)
    g.comm->allgather(g.gshard.data<float>(), garena.data<float>() + g.at, g.plan.block * int64_t(sizeof(float)), dev);
  const io::TensorMap gathered = grad_views(garena);
  for (const ParamSpec& p : table_)
    if (!gowned_.count(p.name) && updates(p)) m.params.at(p.name).copy_from(gathered.at(p.name));
  refresh_compute_weights(m);
}

int64_t Optimizer::grad_arena_numel(const Model& m) const {
  if (!sharded()) return m.arena.numel();
  int64_t n = 0;
  for (const Segment& g : segs_) n += g.plan.arena_numel();
  return n;
}

io::TensorMap Optimizer::grad_views(const Tensor& arena) const {
  if (!sharded()) return arena_views(table_, arena);
  io::TensorMap views;
  for (const Segment& g : segs_) {
    const std::vector<ParamSpec> part(table_.begin() + ptrdiff_t(g.first), table_.begin() + ptrdiff_t(g.end));
    views.merge(shard_views(part, g.plan, arena.slice(0, g.at, g.at + g.plan.arena_numel())));
  }
  return views;
}

void Optimizer::update(Model& m, const io::TensorMap& grads, int64_t step, const Tensor& stats) {
  const double t = double(step + 1);
  const double bc1 = 1 - std::pow(o_.beta1, t), bc2 = 1 - std::pow(o_.beta2, t);
  for (const ParamSpec& p : table_) {
    if (!updates(p) || !m_.count(p.name)) continue;  // frozen, or another rank's (sharded)
    const bool idx = is_indexer_tensor(p.name);
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

io::TensorMap Optimizer::state() const {
  if (!state_per_rank()) return {{"optimizer.m", m_arena_}, {"optimizer.v", v_arena_}};
  io::TensorMap s;
  auto add = [&](const std::string& name) { s["m." + name] = m_.at(name), s["v." + name] = v_.at(name); };
  if (sharded()) {
    for (const auto& [name, t] : m_) add(name);
    return s;
  }
  // Unsharded: every copy of a tensor holds the same moments; its group's rank 0 writes those the
  // phase trains (the sharded layout's tensors).
  for (const Segment& g : segs_)
    for (size_t i = g.first; i < g.end && g.comm->rank() == 0; ++i)
      if (updates(table_[i])) add(table_[i].name);
  return s;
}

void Optimizer::load_state(const io::TensorMap& s, const std::string& what) {
  if (s.count("optimizer.m") || s.count("optimizer.v")) {  // one arena per moment, in the whole table's order
    const int64_t n = table_numel(full_table_);
    for (const char* name : {"optimizer.m", "optimizer.v"}) {
      auto it = s.find(name);
      HMLA_CHECK(it != s.end() && it->second.numel() == n && it->second.dtype() == DType::f32, IoError, what,
                 ": optimizer state '", name, "' is missing or does not match the model");
    }
    if (!state_per_rank()) {
      m_arena_.copy_from(s.at("optimizer.m").view({m_arena_.numel()}));
      v_arena_.copy_from(s.at("optimizer.v").view({v_arena_.numel()}));
      return;
    }
    const io::TensorMap fm = arena_views(full_table_, s.at("optimizer.m").view({n}));
    const io::TensorMap fv = arena_views(full_table_, s.at("optimizer.v").view({n}));
    for (auto& [name, t] : m_) t.copy_from(fm.at(name)), v_.at(name).copy_from(fv.at(name));
    return;
  }
  // Keyed by name (per-rank files, merged): every tensor this optimizer updates must be there; the
  // others' moments are zero in any run (they never move within the phase).
  std::map<std::string, const ParamSpec*> known;
  for (const ParamSpec& p : full_table_) known["m." + p.name] = &p, known["v." + p.name] = &p;
  for (const auto& [key, t] : s) {
    auto it = known.find(key);
    HMLA_CHECK(it != known.end() && t.dtype() == DType::f32 && t.shape() == it->second->shape, IoError, what,
               ": optimizer state '", key, "' matches no tensor of the model");
  }
  for (const ParamSpec& p : table_) {
    if (!updates(p) || !m_.count(p.name)) continue;
    for (const std::string& key : {"m." + p.name, "v." + p.name}) {
      HMLA_CHECK(s.count(key), IoError, what, ": optimizer state '", key, "' is missing");
      (key[0] == 'm' ? m_ : v_).at(p.name).copy_from(s.at(key));
    }
  }
}

}  // namespace hmla
