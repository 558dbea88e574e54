// The rows of `hmla bench v4` (v4_bench.h). Each row builds its own inputs (seeded, filled in
// parallel on the host, then copied to the device), runs what it needs before the timed call (the
// table, the forward's saved tensors) untimed, times one warm-up and the reps with the device
// synchronised around each, and frees everything before the next row: a row's plan counts only
// the tensors live while it is timed. Letters: s rows (one causal document), H heads, d head width,
// HI x DI index heads, K top-k, m compress rate, n_e = floor(s / m) entries, W window, n hc_mult
// streams of width D, E experts, k of them per token.
#include "v4_bench.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <new>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/core/size_check.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/compress.h"
#include "hmla/ops/compressed_attention.h"
#include "hmla/ops/compressed_index.h"
#include "hmla/ops/mhc.h"
#include "hmla/ops/moe.h"
#include "hmla/ops/nn.h"

namespace hmla::bench {

const std::vector<std::string>& v4_bench_kernels() {
  static const std::vector<std::string> k{
      "csa_compress_fwd", "csa_compress_bwd", "csa_index_topk", "csa_attn_fwd", "csa_attn_bwd", "csa_kl_sparse",
      "csa_dense_attn_fwd", "csa_dense_attn_bwd", "csa_kl_dense", "hca_compress_fwd", "hca_compress_bwd",
      "hca_attn_fwd", "hca_attn_bwd", "mhc_pre_fwd", "mhc_pre_bwd", "mhc_post_fwd", "mhc_post_bwd",
      "moe_route_fwd", "moe_route_bwd"};
  return k;
}

namespace {

using Json = nlohmann::ordered_json;
using Timed = std::function<void()>;

// Values uniform in [-sd sqrt 3, sd sqrt 3) (variance sd^2) from a hash of (seed, index), filled by
// every host thread into a block of at most 2^24 that is copied to the device once and repeated
// there: at s = 65536 a host fill and upload of every element would take longer than the kernels.
Tensor filled(const Shape& shape, uint64_t seed, float sd, Device dev, DType dt = DType::f32) {
  const int64_t n = shape_numel(shape), block = std::min<int64_t>(n, int64_t(1) << 24);
  Tensor h = Tensor::empty({block}, DType::f32);
  float* p = h.data<float>();
  const float a = sd * std::sqrt(3.f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < block; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = a * (float(z >> 40) * 0x1p-23f - 1.f);
  }
  Tensor b = h.on(dev), t = b;
  if (n > block) {
    t = Tensor::empty({n}, DType::f32, dev);
    for (int64_t off = 0; off < n; off += block)
      t.slice(0, off, std::min(n, off + block)).copy_from(b.slice(0, 0, std::min(block, n - off)));
  }
  t = t.view(shape);
  return dt == DType::f32 ? t : converted(t, dt);
}

// The compressed entries of one causal document at rate m, their metadata on the device.
struct Entries {
  int64_t n = 0;
  CompressedEntries e;  // first [1, n] on the device
  Tensor last, doc;     // [1, n] i32 on the device
};
Entries entries(const DocLayout& l, int64_t m, Device dev) {
  Entries r;
  r.e = compressed_entries(l, m);
  r.n = r.e.n;
  std::vector<int32_t> last(size_t(r.n)), doc(size_t(r.n), 0);
  for (int64_t i = 0; i < r.n; ++i) last[size_t(i)] = r.e.first.data<int32_t>()[i] + int32_t(m - 1);
  r.last = Tensor::from_vector<int32_t>({1, r.n}, last).on(dev);
  r.doc = Tensor::from_vector<int32_t>({1, r.n}, doc).on(dev);
  r.e.first = r.e.first.on(dev);
  return r;
}

// Query rows t < s of one document: sum of min(t + 1, W) (window keys) or of min(floor((t + 1) / m),
// cap) (visible entries, at most cap; cap 0: all).
double window_pairs(int64_t s, int64_t W) {
  double n = 0;
  for (int64_t t = 0; t < s; ++t) n += double(std::min(t + 1, W));
  return n;
}
double entry_pairs(int64_t s, int64_t m, int64_t cap) {
  double n = 0;
  for (int64_t t = 0; t < s; ++t) n += double(cap > 0 ? std::min((t + 1) / m, cap) : (t + 1) / m);
  return n;
}

std::string machine_name(Device dev) {
  if (dev == Device::cuda) return cuda_device_name(0);
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return "cpu: " + line.substr(line.find(':') + 2);
  return "cpu";
}

// One row: what it runs, its work and the bytes live while it is timed.
struct Row {
  Row(std::string k, Op o) : kernel(std::move(k)), op(o) {}
  std::string kernel;
  Op op;
  Plan plan;
  DType dtype = DType::f32;
  double flops = 0, bytes = 0;  // 0: not counted
  Json fields;                  // the geometry
  MemoryPlan mem;
  std::string skip;             // non-empty: left out, for this reason
};

class Runner {
 public:
  Runner(const V4BenchOptions& o, Device dev, std::ostream& os) : o_(o), dev_(dev), os_(os), name_(machine_name(dev)) {}
  int failures() const { return failures_; }
  bool wanted(const std::string& k) const { return o_.kernels.empty() || std::count(o_.kernels.begin(), o_.kernels.end(), k); }

  // Checks r's plan and bytes, builds its timed call with make() and times it.
  void run(int64_t s, Row& r, const std::function<Timed()>& make) {
    if (!wanted(r.kernel)) return;
    Json j = head(s, r);
    try {
      if (!r.skip.empty()) throw ConfigError(r.skip);
      if (!r.plan) throw ShapeError("the " + std::string(backend(dev_).name()) + " backend does not run it" +
                                    (r.plan.why.empty() ? "" : ": " + r.plan.why));
      r.mem.check("bench v4 " + r.kernel + " at s = " + std::to_string(s), dev_);
    } catch (const Error& e) {
      j["skipped"] = e.what();
      os_ << j.dump() << std::endl;
      return;
    }
    try {
      const Timed f = make();
      const Backend& be = backend(dev_);
      auto once = [&] {
        be.synchronize();
        const auto t0 = Clock::now();
        f();
        be.synchronize();
        return ms_since(t0);
      };
      const double warm = once();
      const int reps = o_.reps > 0 ? o_.reps : int(std::clamp(2000.0 / std::max(warm, 1e-3), 1.0, 5.0));
      std::vector<double> ms;
      for (int i = 0; i < reps; ++i) ms.push_back(once());
      std::sort(ms.begin(), ms.end());
      const double t = ms[ms.size() / 2];  // the median
      j["impl"] = variant_name(r.plan.variant);
      j["dtype"] = dtype_name(r.dtype);
      if (dev_ == Device::cpu) j["threads"] = omp_get_max_threads();
      j["reps"] = reps;
      j["ms"] = t;
      if (r.flops > 0) j["flops"] = r.flops, j["tflops"] = r.flops / (t * 1e-3) / 1e12;
      if (r.bytes > 0) j["bytes"] = r.bytes, j["gbps"] = r.bytes / (t * 1e-3) / 1e9;
      j["plan_bytes"] = r.mem.total();
    } catch (const Error& e) {  // a kernel's refusal or a device error: this row's line says so
      j["error"] = e.what();
      ++failures_;
    } catch (const std::bad_alloc&) {  // the plan is a lower bound: workspaces, fragmentation
      j["error"] = "out of memory while running (the row's plan of " + format_bytes(double(r.mem.total())) + " fitted)";
      ++failures_;
    }
    os_ << j.dump() << std::endl;
  }

 private:
  Json head(int64_t s, const Row& r) const {
    Json j{{"bench", "v4"}, {"kernel", r.kernel}, {"op", op_name(r.op)}, {"s", s}, {"b", 1}};
    for (const auto& [k, v] : r.fields.items()) j[k] = v;
    j["device"] = name_;
    return j;
  }
  const V4BenchOptions& o_;
  Device dev_;
  std::ostream& os_;
  std::string name_;
  int failures_ = 0;
};

// One s: the document, the device and the attention's compute dtype (bf16 on CUDA).
struct At {
  const V4BenchOptions& o;
  int64_t s;
  Device dev;
  DType cd;
  std::shared_ptr<DocLayout> layout;
};

size_t esize(DType t) { return t == DType::f32 || t == DType::i32 ? 4 : 2; }
SizeFactor f(const char* name, int64_t v) { return {name, v}; }

// The compressor's pooling at rate m (CSA: the two series, kv and gate [s, 2 d]; HCA: [s, d]).
void compress_rows(Runner& R, const At& a, const std::string& prefix, int64_t m, bool overlap) {
  const int64_t s = a.s, W = a.o.head_dim, C = overlap ? 2 * W : W;
  const int64_t n = s / m;
  const Json fields{{"d", W}, {"m", m}, {"n_e", n}, {"overlap", overlap}};
  auto base = [&](Row& r, bool bwd) {
    r.fields = fields;
    r.plan = backend(a.dev).plan(r.op, CompressParams{1, s, W, m, n, overlap});
    r.mem.add("kv and gate", {f("2", 2), f("s", s), f("channels", C)}, 4);
    r.mem.add("ape", {f("m", m), f("channels", C)}, 4);
    r.mem.add(bwd ? "dout" : "out", {f("n_e", n), f("head_dim", W)}, 4);
    // fwd: read kv, gate, ape, write out; bwd: read dout, kv, gate, ape, write dkv, dgate, read-add-write dape
    r.bytes = 4.0 * (bwd ? double(n * W + 4 * s * C + 3 * m * C) : double(2 * s * C + m * C + n * W));
  };
  auto inputs = [a, m, C](const std::shared_ptr<Entries>& e, Tensor& kv, Tensor& gate, Tensor& ape) {
    *e = entries(*a.layout, m, a.dev);
    kv = filled({1, a.s, C}, 1, 1.f, a.dev), gate = filled({1, a.s, C}, 2, 1.f, a.dev);
    ape = filled({m, C}, 3, 0.1f, a.dev);
  };
  Row fw{prefix + "_fwd", Op::compress_fwd};
  base(fw, false);
  R.run(s, fw, [=] {
    auto e = std::make_shared<Entries>();
    Tensor kv, gate, ape;
    inputs(e, kv, gate, ape);
    Tensor out = Tensor::empty({1, e->n, W}, DType::f32, a.dev);
    return Timed([=] { compress_fwd(kv, gate, ape, e->e, *a.layout, overlap, out); });
  });
  Row bw{prefix + "_bwd", Op::compress_bwd};
  base(bw, true);
  bw.mem.add("dkv and dgate", {f("2", 2), f("s", s), f("channels", C)}, 4);
  R.run(s, bw, [=] {
    auto e = std::make_shared<Entries>();
    Tensor kv, gate, ape;
    inputs(e, kv, gate, ape);
    Tensor dout = filled({1, e->n, W}, 4, 1.f, a.dev);
    Tensor dkv = Tensor::empty({1, a.s, C}, DType::f32, a.dev), dgate = Tensor::empty({1, a.s, C}, DType::f32, a.dev);
    Tensor dape = Tensor::zeros({m, C}, DType::f32, a.dev);
    return Timed([=] { compress_bwd(dout, kv, gate, ape, e->e, *a.layout, overlap, dkv, dgate, dape); });
  });
}

// The CSA indexer's inputs (qI, kI, w with its scales folded in) over the entries of rate m.
CompressedIndexInputs index_inputs(const At& a, const Entries& e) {
  const V4BenchOptions& o = a.o;
  return {filled({1, a.s, o.index_heads, o.index_dim}, 11, 0.3f, a.dev), filled({1, e.n, o.index_dim}, 12, 0.3f, a.dev),
          filled({1, a.s, o.index_heads}, 13, 0.1f, a.dev), e.last, e.doc, a.layout.get()};
}
void index_plan(MemoryPlan& p, const At& a, int64_t n) {
  p.add("qI", {f("s", a.s), f("index_heads", a.o.index_heads), f("index_dim", a.o.index_dim)}, 4);
  p.add("kI", {f("n_e", n), f("index_dim", a.o.index_dim)}, 4);
  p.add("w", {f("s", a.s), f("index_heads", a.o.index_heads)}, 4);
}
CompressedIndexParams index_params(const At& a, int64_t n, int64_t K) {
  CompressedIndexParams p;
  p.b = 1, p.s = a.s, p.sq = a.s, p.nI = a.o.index_heads, p.dI = a.o.index_dim, p.n_e = n, p.K = K;
  return p;
}

void index_row(Runner& R, const At& a) {
  const int64_t m = a.o.csa_rate, n = a.s / m, K = a.o.topk;
  Row r{"csa_index_topk", Op::compressed_index_topk};
  r.fields = {{"HI", a.o.index_heads}, {"DI", a.o.index_dim}, {"K", K}, {"m", m}, {"n_e", n}};
  r.plan = backend(a.dev).plan(r.op, index_params(a, n, K));
  index_plan(r.mem, a, n);
  r.mem.add("idx", {f("s", a.s), f("index_topk", K)}, 4);
  r.flops = 2.0 * double(a.o.index_heads * a.o.index_dim) * entry_pairs(a.s, m, 0);
  R.run(a.s, r, [=] {
    auto e = std::make_shared<Entries>(entries(*a.layout, m, a.dev));
    const CompressedIndexInputs in = index_inputs(a, *e);
    return Timed([=] { (void)compressed_index_topk(in, K); });
  });
}

// The attention core's tensors in the compute dtype, with the top-k table when selected (built
// untimed by the CSA indexer, whose inputs are freed before the core's are made).
struct Core {
  Entries e;
  AttnCompressedInputs in;
};
std::shared_ptr<Core> core(const At& a, int64_t m, bool selected) {
  auto c = std::make_shared<Core>();
  c->e = entries(*a.layout, m, a.dev);
  const int64_t H = a.o.heads, d = a.o.head_dim;
  if (selected) c->in.idx = compressed_index_topk(index_inputs(a, c->e), a.o.topk);
  c->in.q = filled({1, a.s, H, d}, 21, 1.f, a.dev, a.cd);
  c->in.kv = filled({1, a.s, d}, 22, 1.f, a.dev, a.cd);
  c->in.ent = filled({1, c->e.n, d}, 23, 1.f, a.dev, a.cd);
  c->in.ent_last = c->e.last, c->in.ent_doc = c->e.doc, c->in.layout = a.layout.get();
  c->in.sink = filled({H}, 24, 1.f, a.dev);
  c->in.scale = 1.f / std::sqrt(float(d));
  c->in.window = a.o.window;
  return c;
}
void core_plan(MemoryPlan& p, const At& a, int64_t n, bool selected, bool bwd) {
  const int64_t H = a.o.heads, d = a.o.head_dim;
  const size_t es = esize(a.cd);
  for (const char* what : {"q", "out"}) p.add(what, {f("s", a.s), f("heads", H), f("head_dim", d)}, int64_t(es));
  p.add("kv", {f("s", a.s), f("head_dim", d)}, int64_t(es));
  p.add("entries", {f("n_e", n), f("head_dim", d)}, int64_t(es));
  p.add("lse", {f("heads", H), f("s", a.s)}, 4);
  if (selected) p.add("idx", {f("s", a.s), f("index_topk", a.o.topk)}, 4);
  if (!bwd) return;
  for (const char* what : {"dout", "dq"}) p.add(what, {f("s", a.s), f("heads", H), f("head_dim", d)}, int64_t(es));
  p.add("dkv", {f("s", a.s), f("head_dim", d)}, int64_t(es));
  p.add("dent", {f("n_e", n), f("head_dim", d)}, int64_t(es));
}

// The core over the window, the sink and the selected (CSA) or every visible (dense CSA, HCA) entry.
void attn_rows(Runner& R, const At& a, const std::string& prefix, int64_t m, bool selected, bool dense) {
  const int64_t s = a.s, n = s / m, H = a.o.heads, d = a.o.head_dim;
  const double pairs = window_pairs(s, a.o.window) + entry_pairs(s, m, selected ? a.o.topk : 0);
  AttnCompressedParams pp;
  pp.dtype = a.cd, pp.b = 1, pp.s = s, pp.sq = s, pp.H = H, pp.d = d, pp.n_e = n, pp.k = selected ? a.o.topk : 0;
  pp.window = a.o.window;
  Json fields{{"H", H}, {"d", d}, {"window", a.o.window}, {"m", m}, {"n_e", n}};
  if (selected) fields["K"] = a.o.topk;
  fields["pairs"] = pairs;
  const std::string skip = dense && a.o.dense_max_s > 0 && s > a.o.dense_max_s
                               ? "above --dense-max-s " + std::to_string(a.o.dense_max_s) + " (every visible entry: s^2 / " +
                                     std::to_string(2 * m) + " pairs)"
                               : "";
  for (bool bwd : {false, true}) {
    Row r{prefix + (bwd ? "_bwd" : "_fwd"), bwd ? Op::attn_compressed_bwd : Op::attn_compressed_fwd};
    r.fields = fields, r.dtype = a.cd, r.skip = skip;
    r.plan = backend(a.dev).plan(r.op, pp);
    core_plan(r.mem, a, n, selected, bwd);
    r.flops = (bwd ? 2.5 : 1.0) * 2.0 * double(d + d) * double(H) * pairs;
    R.run(s, r, [=] {
      std::shared_ptr<Core> c = core(a, m, selected);
      const AttnCompressedSaved sv{Tensor::empty({1, s, H, d}, a.cd, a.dev), Tensor::empty({1, H, s}, DType::f32, a.dev)};
      if (!bwd) return Timed([=] { attn_compressed_fwd(c->in, sv); });
      attn_compressed_fwd(c->in, sv);
      const Tensor dout = filled({1, s, H, d}, 25, 1.f, a.dev, a.cd), dsink = Tensor::zeros({H}, DType::f32, a.dev);
      return Timed([=] { (void)attn_compressed_bwd(c->in, sv, dout, dsink); });
    });
  }
}

// The CSA indexer's KL over every visible entry (dsa_warmup) or over the top-k (dsa_sparse), with
// the lse of the core that ran on the same candidates (untimed, its compute-dtype copies freed).
void kl_row(Runner& R, const At& a, bool sparse, bool dense) {
  const int64_t s = a.s, m = a.o.csa_rate, n = s / m, H = a.o.heads, d = a.o.head_dim, K = a.o.topk;
  const int64_t HIDI = a.o.index_heads * a.o.index_dim;
  Row r{sparse ? "csa_kl_sparse" : "csa_kl_dense", sparse ? Op::compressed_index_kl_sparse : Op::compressed_index_kl_dense};
  const double cand = entry_pairs(s, m, sparse ? K : 0);
  r.fields = {{"H", H}, {"d", d}, {"HI", a.o.index_heads}, {"DI", a.o.index_dim}, {"m", m}, {"n_e", n}};
  if (sparse) r.fields["K"] = K;
  r.fields["pairs"] = cand;
  if (dense && a.o.dense_max_s > 0 && s > a.o.dense_max_s)
    r.skip = "above --dense-max-s " + std::to_string(a.o.dense_max_s) + " (every visible entry: s^2 / " +
             std::to_string(2 * m) + " pairs)";
  CompressedIndexKlParams kp;
  static_cast<CompressedIndexParams&>(kp) = index_params(a, n, sparse ? K : 0);
  kp.H = H, kp.d = d;
  r.plan = backend(a.dev).plan(r.op, kp);
  index_plan(r.mem, a, n);
  r.mem.add("q (f32)", {f("s", s), f("heads", H), f("head_dim", d)}, 4);
  r.mem.add("entries (f32)", {f("n_e", n), f("head_dim", d)}, 4);
  r.mem.add("lse", {f("heads", H), f("s", s)}, 4);
  if (sparse) r.mem.add("topk", {f("s", s), f("index_topk", K)}, 4);
  r.mem.add("dqI", {f("s", s), f("index_heads", a.o.index_heads), f("index_dim", a.o.index_dim)}, 4);
  r.flops = double(6 * HIDI + 2 * H * d) * cand;
  R.run(s, r, [=] {
    auto e = std::make_shared<Entries>(entries(*a.layout, m, a.dev));
    CompressedIndexKlInputs in;
    in.sc = index_inputs(a, *e);
    in.q = filled({1, s, H, d}, 21, 1.f, a.dev);
    in.ent = filled({1, n, d}, 23, 1.f, a.dev);
    in.scale = 1.f / std::sqrt(float(d));
    in.row_weight = Tensor::from_vector<float>({1, s}, std::vector<float>(size_t(s), 1.f / float(s))).on(a.dev);
    in.kl_acc = Tensor::zeros({1}, DType::f64, a.dev);  // no read-back per call: as the trainer runs it
    if (sparse) in.topk = compressed_index_topk(in.sc, K);
    {
      AttnCompressedInputs c{in.q.dtype() == a.cd ? in.q : converted(in.q, a.cd), filled({1, s, d}, 22, 1.f, a.dev, a.cd),
                             in.ent.dtype() == a.cd ? in.ent : converted(in.ent, a.cd), e->last, e->doc, in.topk,
                             a.layout.get(), filled({H}, 24, 1.f, a.dev), in.scale, a.o.window};
      in.lse = attn_compressed_fwd(c).lse;
    }
    if (sparse) return Timed([=] { (void)compressed_index_kl_sparse(in); });
    return Timed([=] { (void)compressed_index_kl_dense(in); });
  });
}

// mHC's entry and exit over s tokens of hc_mult streams of width hidden.
void mhc_rows(Runner& R, const At& a) {
  const int64_t N = a.s, n = a.o.hc_mult, D = a.o.hidden, mr = (2 + n) * n, K = n * D;
  const int64_t iters = a.o.sinkhorn_iters;
  const Json fields{{"hc_mult", n}, {"hidden", D}, {"sinkhorn_iters", iters}};
  MhcParams mp;
  mp.N = N, mp.n = n, mp.D = D, mp.iters = iters;
  auto weights = [=] {
    return MhcWeights{filled({mr, K}, 31, 0.02f, a.dev), filled({mr}, 32, 0.1f, a.dev),
                      Tensor::from_vector<float>({3}, {1.f, 1.f, 1.f}).on(a.dev)};
  };
  struct Pre {
    Tensor x, y, post, comb;
    MhcWeights w;
    MhcSaved sv;
  };
  auto pre = [=] {
    auto p = std::make_shared<Pre>();
    p->x = filled({N, n, D}, 33, 1.f, a.dev), p->w = weights();
    p->y = Tensor::empty({N, D}, DType::f32, a.dev), p->post = Tensor::empty({N, n}, DType::f32, a.dev);
    p->comb = Tensor::empty({N, n, n}, DType::f32, a.dev);
    p->sv = {Tensor::empty({N}, DType::f32, a.dev), Tensor::empty({N, mr}, DType::f32, a.dev)};
    return p;
  };
  const double streams = double(N * n * D), row = double(N * D), small = double(N * (n + n * n + 1 + mr)), fn = double(mr * K);
  for (const char* k : {"mhc_pre_fwd", "mhc_pre_bwd", "mhc_post_fwd", "mhc_post_bwd"}) {
    const std::string kernel = k;
    const bool bwd = kernel.ends_with("bwd"), is_pre = kernel.starts_with("mhc_pre");
    Row r{kernel, is_pre ? (bwd ? Op::mhc_pre_bwd : Op::mhc_pre_fwd) : (bwd ? Op::mhc_post_bwd : Op::mhc_post_fwd)};
    r.fields = fields;
    r.plan = backend(a.dev).plan(r.op, mp);
    r.mem.add(bwd ? "x and dx" : "x", {f("s", N), f("hc_mult", n), f("hidden", D)}, bwd ? 8 : 4);
    r.mem.add("y", {f("s", N), f("hidden", D)}, bwd ? 8 : 4);
    if (!is_pre) r.mem.add(bwd ? "dout" : "out", {f("s", N), f("hc_mult", n), f("hidden", D)}, 4);
    if (is_pre) {
      r.flops = (bwd ? 4.0 : 2.0) * (double(N) * double(mr) * double(K) + streams);
      r.bytes = 4.0 * (bwd ? 2 * streams + row + 2 * small + 3 * fn : streams + row + small + fn);
    } else {
      r.bytes = 4.0 * (bwd ? 3 * streams + 2 * row + 2 * small : 2 * streams + row + small);
    }
    R.run(N, r, [=]() -> Timed {
      std::shared_ptr<Pre> p = pre();
      const float ne = 1e-6f, he = 1e-6f;
      if (kernel == "mhc_pre_fwd") return [=] { mhc_pre_fwd(p->x, p->w, iters, ne, he, p->y, p->post, p->comb, p->sv); };
      mhc_pre_fwd(p->x, p->w, iters, ne, he, p->y, p->post, p->comb, p->sv);
      const Tensor dx = Tensor::empty({N, n, D}, DType::f32, a.dev);
      if (kernel == "mhc_pre_bwd") {
        const Tensor dy = filled({N, D}, 34, 1.f, a.dev), dpost = filled({N, n}, 35, 1.f, a.dev),
                     dcomb = filled({N, n, n}, 36, 1.f, a.dev);
        const MhcWeights dw{Tensor::zeros({mr, K}, DType::f32, a.dev), Tensor::zeros({mr}, DType::f32, a.dev),
                            Tensor::zeros({3}, DType::f32, a.dev)};
        return [=] { mhc_pre_bwd(dy, dpost, dcomb, p->x, p->w, p->sv, iters, he, dx, dw); };
      }
      p->w = {}, p->sv = {};  // the exit reads x, y, post and comb only
      if (kernel == "mhc_post_fwd") return [=] { mhc_post_fwd(p->x, p->y, p->post, p->comb, dx); };
      const Tensor dout = filled({N, n, D}, 37, 1.f, a.dev), dy = Tensor::empty({N, D}, DType::f32, a.dev);
      const Tensor dpost = Tensor::empty({N, n}, DType::f32, a.dev), dcomb = Tensor::empty({N, n, n}, DType::f32, a.dev);
      return [=] { mhc_post_bwd(dout, p->x, p->y, p->post, p->comb, dx, dy, dpost, dcomb); };
    });
  }
}

// DeepSeek-V4's router (sqrtsoftplus scores, the correction bias, one group) over s tokens.
void route_rows(Runner& R, const At& a) {
  const int64_t N = a.s, E = a.o.experts, k = a.o.experts_per_tok;
  const MoeRouter router{1, 1, true, 1.5f, MoeScore::sqrtsoftplus};
  MoeRouteParams rp;
  rp.N = N, rp.E = E, rp.k = k, rp.score_fn = MoeScore::sqrtsoftplus;
  for (bool bwd : {false, true}) {
    Row r{bwd ? "moe_route_bwd" : "moe_route_fwd", bwd ? Op::moe_route_bwd : Op::moe_route_fwd};
    r.fields = {{"experts", E}, {"experts_per_tok", k}, {"scoring_func", "sqrtsoftplus"}};
    r.plan = backend(a.dev).plan(r.op, rp);
    r.mem.add(bwd ? "logits and dlogits" : "logits", {f("s", N), f("experts", E)}, bwd ? 8 : 4);
    r.mem.add("idx, weight, score", {f("3", 3), f("s", N), f("experts_per_tok", k)}, 4);
    r.bytes = 4.0 * (bwd ? double(3 * N * k + 2 * N * E) : double(N * E + E + 3 * N * k));
    R.run(N, r, [=]() -> Timed {
      const Tensor logits = filled({N, E}, 41, 1.f, a.dev), bias = filled({E}, 42, 0.1f, a.dev);
      const MoeRouting rt{Tensor::empty({N, k}, DType::i32, a.dev), Tensor::empty({N, k}, DType::f32, a.dev),
                          Tensor::empty({N, k}, DType::f32, a.dev)};
      if (!bwd) return [=] { moe_route_fwd(logits, bias, router, rt); };
      moe_route_fwd(logits, bias, router, rt);
      const Tensor dweight = filled({N, k}, 43, 1.f, a.dev), dlogits = Tensor::empty({N, E}, DType::f32, a.dev);
      return [=] { moe_route_bwd(dweight, rt, router, dlogits, logits); };
    });
  }
}

}  // namespace

void run_v4_bench(const V4BenchOptions& o, std::ostream& os) {
  const Device dev = o.device == "cuda" ? Device::cuda : Device::cpu;
  Runner R(o, dev, os);
  for (int64_t s : o.seq_lens) {
    auto layout = std::make_shared<DocLayout>(layout_causal(1, s));
    if (dev != Device::cpu) layout->device_start = layout->doc_start.to(dev), layout->device_end = layout->doc_end.to(dev);
    const At a{o, s, dev, compute_dtype(dev), layout};
    compress_rows(R, a, "csa_compress", o.csa_rate, true);
    index_row(R, a);
    attn_rows(R, a, "csa_attn", o.csa_rate, true, false);
    kl_row(R, a, true, false);
    attn_rows(R, a, "csa_dense_attn", o.csa_rate, false, true);
    kl_row(R, a, false, true);
    compress_rows(R, a, "hca_compress", o.hca_rate, false);
    attn_rows(R, a, "hca_attn", o.hca_rate, false, false);
    mhc_rows(R, a);
    route_rows(R, a);
  }
  HMLA_CHECK(R.failures() == 0, Error, "bench v4: ", R.failures(), " row(s) failed; their lines say why");
}

}  // namespace hmla::bench
