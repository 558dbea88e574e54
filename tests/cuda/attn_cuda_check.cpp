#include "attn_cuda_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <random>
#include <sstream>

#include "attn_dense_ref.h"
#include "case_support.h"
#include "check_util.h"
#include "hmla/core/cuda.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/backend.h"
#include "runtime.h"

namespace hmla::cuda_check {

namespace {

// The naive bf16 implementation of the rule: materialised scores, every stored intermediate and
// output rounded to bf16, f32 sums. Same conventions as ref::attn_dense_ref.
struct Naive {
  std::vector<float> out, lse, dq, dk, dv, dsink;
};

Naive naive_bf16(const ref::AttnDims& d, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v, const std::vector<int32_t>& ds, const std::vector<float>& sink,
                 float scale, const std::vector<float>& dout) {
  const int64_t b = d.b, s = d.s, H = d.H, Hkv = d.Hkv, Dqk = d.Dqk, Dv = d.Dv, grp = H / Hkv;
  Naive r{std::vector<float>(b * s * H * Dv, 0.f), std::vector<float>(b * H * s, INFINITY),
          std::vector<float>(b * s * H * Dqk, 0.f), std::vector<float>(b * s * Hkv * Dqk, 0.f),
          std::vector<float>(b * s * Hkv * Dv, 0.f), std::vector<float>(sink.size(), 0.f)};
  std::vector<float> dk32(r.dk.size(), 0.f), dv32(r.dv.size(), 0.f);
  std::vector<float> P(s), dS(s);
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / grp;
      for (int64_t t = 0; t < s; ++t) {
        const int64_t lo = ds[bb * s + t];
        if (lo > t) continue;
        const float* qt = &q[((bb * s + t) * H + h) * Dqk];
        float m = -INFINITY;
        for (int64_t j = lo; j <= t; ++j) {
          const float* kj = &k[((bb * s + j) * Hkv + hk) * Dqk];
          float acc = 0.f;
          for (int64_t c = 0; c < Dqk; ++c) acc += qt[c] * kj[c];
          P[j] = scale * rbf(acc);
          m = std::max(m, P[j]);
        }
        float z = sink.empty() ? 0.f : std::exp(sink[h] - m);
        for (int64_t j = lo; j <= t; ++j) z += (P[j] = std::exp(P[j] - m));
        const float lse = m + std::log(z);
        r.lse[(bb * H + h) * s + t] = lse;
        float* o = &r.out[((bb * s + t) * H + h) * Dv];
        std::vector<float> acc(Dv, 0.f);
        for (int64_t j = lo; j <= t; ++j) {
          P[j] = rbf(P[j] / z);
          const float* vj = &v[((bb * s + j) * Hkv + hk) * Dv];
          for (int64_t c = 0; c < Dv; ++c) acc[c] += P[j] * vj[c];
        }
        for (int64_t c = 0; c < Dv; ++c) o[c] = rbf(acc[c]);
        // Backward of this row.
        const float* g = &dout[((bb * s + t) * H + h) * Dv];
        float D = 0.f;
        for (int64_t c = 0; c < Dv; ++c) D += g[c] * o[c];
        if (!sink.empty()) r.dsink[h] -= std::exp(sink[h] - lse) * D;
        std::vector<float> dq(Dqk, 0.f);
        for (int64_t j = lo; j <= t; ++j) {
          const float* vj = &v[((bb * s + j) * Hkv + hk) * Dv];
          float dp = 0.f;
          for (int64_t c = 0; c < Dv; ++c) dp += g[c] * vj[c];
          dS[j] = rbf(P[j] * (rbf(dp) - D));
          const float* kj = &k[((bb * s + j) * Hkv + hk) * Dqk];
          for (int64_t c = 0; c < Dqk; ++c) dq[c] += dS[j] * kj[c];
          float* dkj = &dk32[((bb * s + j) * Hkv + hk) * Dqk];
          for (int64_t c = 0; c < Dqk; ++c) dkj[c] += scale * dS[j] * qt[c];
          float* dvj = &dv32[((bb * s + j) * Hkv + hk) * Dv];
          for (int64_t c = 0; c < Dv; ++c) dvj[c] += P[j] * g[c];
        }
        float* dqt = &r.dq[((bb * s + t) * H + h) * Dqk];
        for (int64_t c = 0; c < Dqk; ++c) dqt[c] = rbf(scale * dq[c]);
      }
    }
  for (size_t i = 0; i < dk32.size(); ++i) r.dk[i] = rbf(dk32[i]);
  for (size_t i = 0; i < dv32.size(); ++i) r.dv[i] = rbf(dv32[i]);
  return r;
}

// Rows [r0, s) of a [b, s, width] or ([b*H], s) vector.
template <class T>
std::vector<T> rows_from(const std::vector<T>& x, int64_t outer, int64_t s, int64_t width, int64_t r0) {
  std::vector<T> v;
  for (int64_t o = 0; o < outer; ++o) v.insert(v.end(), x.begin() + (o * s + r0) * width, x.begin() + (o + 1) * s * width);
  return v;
}

DocLayout layout_of(const Case& c) {
  if (!c.end_rows.empty()) return layout_from_end_rows(c.b, c.s, c.end_rows);
  return c.cu.empty() ? layout_causal(c.b, c.s) : layout_from_cu_seqlens(c.s, c.cu);
}

}  // namespace

std::vector<Case> cases() { return op_cases::run_by(cuda_backend(), DType::bf16, op_cases::attn_dense()); }

bool device_available() { return cuda_built() && cuda_device_count() > 0; }

CaseResult check_case(const Case& c, uint64_t seed, Device dev, float kernel_scale_factor, AttnBackend backend) {
  CaseResult res{c.name, attn_backend_name(backend), "", {}, false, false};
  const DocLayout layout = layout_of(c);
  const int64_t r0 = std::max<int64_t>(c.q_row0, 0), sq = c.s - r0;
  auto q = randn_bf16(c.b * c.s * c.H * c.Dqk, seed), k = randn_bf16(c.b * c.s * c.Hkv * c.Dqk, seed + 1),
       dout = randn_bf16(c.b * c.s * c.H * c.Dv, seed + 3);
  std::vector<float> v;
  if (c.v_from_k) {
    for (int64_t r = 0; r < c.b * c.s * c.Hkv; ++r) v.insert(v.end(), k.begin() + r * c.Dqk, k.begin() + r * c.Dqk + c.Dv);
  } else {
    v = randn_bf16(c.b * c.s * c.Hkv * c.Dv, seed + 2);
  }
  const std::vector<float> sink = c.sink ? randn_bf16(c.H, seed + 4) : std::vector<float>{};
  for (int64_t bb = 0; bb < c.b; ++bb)  // rows before the slice take no gradient
    std::fill(dout.begin() + bb * c.s * c.H * c.Dv, dout.begin() + (bb * c.s + r0) * c.H * c.Dv, 0.f);
  const float scale = 1.f / std::sqrt(float(c.Dqk));

  // The kernel under test, twice (determinism).
  AttnDenseInputs in;
  in.q = put({c.b, sq, c.H, c.Dqk}, rows_from(q, c.b, c.s, c.H * c.Dqk, r0), dev);
  in.k = put({c.b, c.s, c.Hkv, c.Dqk}, k, dev);
  in.v = c.v_from_k ? in.k.slice(3, 0, c.Dv) : put({c.b, c.s, c.Hkv, c.Dv}, v, dev);
  if (c.sink) in.sink = Tensor::from_vector<float>({c.H}, sink).to(dev);
  in.layout = &layout;
  in.scale = scale * kernel_scale_factor;
  in.q_row0 = r0;
  in.backend = dev == Device::cuda ? backend : AttnBackend::hmla;
  const Tensor dout_dev = put({c.b, sq, c.H, c.Dv}, rows_from(dout, c.b, c.s, c.H * c.Dv, r0), dev);
  if (in.backend == AttnBackend::cudnn) {
    try {
      attn_dense_fwd(in);
    } catch (const Error& e) {  // cuDNN does not take this case: say why, and it is not a failure
      res.declined = e.what(), res.ok = true;
      return res;
    }
  }
  std::vector<std::vector<float>> run[2];
  for (auto& got : run) {
    AttnDenseSaved sv = attn_dense_fwd(in);
    AttnDenseGrads g = attn_dense_bwd(in, sv, dout_dev);
    got = {host(sv.out), host(sv.lse), host(g.dq), host(g.dk), host(g.dv)};
    if (c.sink) got.push_back(host(g.dsink));
  }
  res.deterministic = run[0] == run[1];

  // The references on the same (bf16-valued) inputs.
  const ref::AttnDims d{c.b, c.s, c.H, c.Hkv, c.Dqk, c.Dv};
  const auto ds = layout.doc_start.to_vector<int32_t>();
  auto f64 = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  auto o64 = ref::attn_dense_ref<double>(d, f64(q), f64(k), f64(v), ds, f64(sink), double(scale), f64(dout));
  Naive nb = naive_bf16(d, q, k, v, ds, sink, scale, dout);
  // hmla's CPU kernel (f32) on the same inputs, for the record.
  AttnDenseInputs cpu = in;
  cpu.scale = scale;
  cpu.q = Tensor::from_vector<float>({c.b, sq, c.H, c.Dqk}, rows_from(q, c.b, c.s, c.H * c.Dqk, r0));
  cpu.k = Tensor::from_vector<float>({c.b, c.s, c.Hkv, c.Dqk}, k);
  cpu.v = Tensor::from_vector<float>({c.b, c.s, c.Hkv, c.Dv}, v);
  if (c.sink) cpu.sink = Tensor::from_vector<float>({c.H}, sink);
  AttnDenseSaved csv = attn_dense_fwd(cpu);
  AttnDenseGrads cg = attn_dense_bwd(
      cpu, csv, Tensor::from_vector<float>({c.b, sq, c.H, c.Dv}, rows_from(dout, c.b, c.s, c.H * c.Dv, r0)));
  struct Item {
    const char* name;
    std::vector<double> ref;
    std::vector<float> naive, cpu;
  };
  std::vector<Item> items{
      {"out", rows_from(o64.out, c.b, c.s, c.H * c.Dv, r0), rows_from(nb.out, c.b, c.s, c.H * c.Dv, r0),
       csv.out.to_vector<float>()},
      {"lse", rows_from(o64.lse, c.b * c.H, c.s, 1, r0), rows_from(nb.lse, c.b * c.H, c.s, 1, r0),
       csv.lse.to_vector<float>()},
      {"dq", rows_from(o64.dq, c.b, c.s, c.H * c.Dqk, r0), rows_from(nb.dq, c.b, c.s, c.H * c.Dqk, r0),
       cg.dq.to_vector<float>()},
      {"dk", o64.dk, nb.dk, cg.dk.to_vector<float>()},
      {"dv", o64.dv, nb.dv, cg.dv.to_vector<float>()}};
  if (c.sink) items.push_back({"dsink", o64.dsink, nb.dsink, cg.dsink.to_vector<float>()});
  // dsink reads the forward's output as the kernel stored it (bf16, as FlashAttention's D does):
  // that rounding moves dsink by |dsink(O) - dsink(bf16(O))| on the exact O, part of the kernel's
  // own final rounding for this output.
  double dsink_rounding = 0;
  if (c.sink)
    for (int64_t h = 0; h < c.H; ++h) {
      double exact = 0, rounded = 0;
      for (int64_t bb = 0; bb < c.b; ++bb)
        for (int64_t t = r0; t < c.s; ++t) {
          const double l = o64.lse[(bb * c.H + h) * c.s + t];
          if (!std::isfinite(l)) continue;
          const int64_t row = ((bb * c.s + t) * c.H + h) * c.Dv;
          double D = 0, Dr = 0;
          for (int64_t k = 0; k < c.Dv; ++k) {
            D += double(dout[row + k]) * o64.out[row + k];
            Dr += double(dout[row + k]) * double(rbf(float(o64.out[row + k])));
          }
          exact -= std::exp(double(sink[h]) - l) * D;
          rounded -= std::exp(double(sink[h]) - l) * Dr;
        }
      dsink_rounding = std::max(dsink_rounding, std::abs(rounded - exact));
    }
  res.ok = res.deterministic;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    TensorErr e;
    e.name = it.name;
    e.err = max_err(run[0][i], it.ref);
    e.naive_err = max_err(it.naive, it.ref);
    e.max_ref = max_abs(it.ref);
    // The rounding term: one bf16 rounding (half an ulp, <= 2^-8 relative) of the kernel's own bf16
    // outputs; 8 f32 ulps for its f32 outputs (lse, dsink), as in the CPU rule, and for dsink the
    // effect of the stored bf16 output it reads.
    const bool f32_out = e.name == "lse" || e.name == "dsink";
    e.bound = 2 * e.naive_err + (f32_out ? 8 * FLT_EPSILON : std::ldexp(1.0, -8)) * e.max_ref +
              (e.name == "dsink" ? dsink_rounding : 0.0);
    e.vs_cpu = max_err(run[0][i], std::vector<double>(it.cpu.begin(), it.cpu.end()));
    e.ok = e.err <= e.bound;
    res.ok &= e.ok;
    res.tensors.push_back(e);
  }
  return res;
}

std::string CaseResult::json() const {
  std::ostringstream os;
  os << "{\"check\":\"cuda-attention\",\"case\":\"" << name << "\",\"backend\":\"" << backend
     << "\",\"ok\":" << (ok ? "true" : "false");
  if (!declined.empty()) return os.str() + ",\"declined\":\"" + json_escape(declined) + "\"}";
  os << ",\"deterministic\":" << (deterministic ? "true" : "false");
  for (const TensorErr& e : tensors)
    os << ",\"" << e.name << "\":{\"err\":" << e.err << ",\"naive_bf16_err\":" << e.naive_err << ",\"bound\":" << e.bound
       << ",\"vs_cpu_f32\":" << e.vs_cpu << "}";
  os << "}";
  return os.str();
}

BenchResult bench(const BenchShape& sh, int reps) {
  const int64_t b = 1, doc = sh.s / sh.docs;
  std::vector<int64_t> cu;
  for (int64_t i = 0; i <= sh.docs; ++i) cu.push_back(std::min(i * doc, sh.s));
  const DocLayout layout = layout_from_cu_seqlens(sh.s, {cu});
  AttnDenseInputs in;
  in.q = put({b, sh.s, sh.H, sh.Dqk}, randn_bf16(b * sh.s * sh.H * sh.Dqk, 1));
  in.k = put({b, sh.s, sh.H, sh.Dqk}, randn_bf16(b * sh.s * sh.H * sh.Dqk, 2));
  in.v = put({b, sh.s, sh.H, sh.Dv}, randn_bf16(b * sh.s * sh.H * sh.Dv, 3));
  in.layout = &layout;
  in.scale = 1.f / std::sqrt(float(sh.Dqk));
  in.backend = sh.backend;
  const Tensor dout = put({b, sh.s, sh.H, sh.Dv}, randn_bf16(b * sh.s * sh.H * sh.Dv, 4));
  AttnDenseSaved sv{Tensor::empty({b, sh.s, sh.H, sh.Dv}, DType::bf16, Device::cuda),
                    Tensor::empty({b, sh.H, sh.s}, DType::f32, Device::cuda)};
  AttnDenseGrads g{Tensor::empty(in.q.shape(), DType::bf16, Device::cuda),
                   Tensor::empty(in.k.shape(), DType::bf16, Device::cuda),
                   Tensor::empty(in.v.shape(), DType::bf16, Device::cuda), Tensor()};
  cudaStream_t st = cuda::current_stream().get();
  cudaEvent_t e0, e1;
  cuda::check(cudaEventCreate(&e0), "cudaEventCreate");
  cuda::check(cudaEventCreate(&e1), "cudaEventCreate");
  auto time = [&](bool backward) {
    std::vector<float> ms;
    for (int r = 0; r < reps + 2; ++r) {  // two warm-up runs
      cuda::check(cudaEventRecord(e0, st), "cudaEventRecord");
      attn_dense_fwd(in, sv);
      if (backward) attn_dense_bwd(in, sv, dout, g);
      cuda::check(cudaEventRecord(e1, st), "cudaEventRecord");
      cuda::check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float t = 0;
      cuda::check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
      if (r >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  BenchResult r;
  r.shape = sh;
  try {
    attn_dense_fwd(in, sv);
  } catch (const Error& e) {  // backend cudnn, declined
    r.declined = e.what();
    return r;
  }
  Allocator& a = allocator(Device::cuda);
  a.reset_peak();
  r.fwd_ms = time(false);
  r.fwdbwd_ms = time(true);
  r.peak_bytes = int64_t(a.peak_bytes());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  // Useful FLOPs (FlashAttention's convention): 2 (Dqk + Dv) per allowed (query, key) pair and
  // head forward, 2.5x that backward.
  const double fwd_flops = 2.0 * double(layout.allowed_pairs()) * double(sh.H) * double(sh.Dqk + sh.Dv);
  r.fwd_tflops = fwd_flops / (r.fwd_ms * 1e-3) / 1e12;
  r.fwdbwd_tflops = 3.5 * fwd_flops / (r.fwdbwd_ms * 1e-3) / 1e12;
  return r;
}

std::string BenchResult::json() const {
  std::ostringstream os;
  os << "{\"bench\":\"cuda-attention\",\"backend\":\"" << attn_backend_name(shape.backend) << "\",\"s\":" << shape.s
     << ",\"H\":" << shape.H << ",\"dqk\":" << shape.Dqk << ",\"dv\":" << shape.Dv << ",\"docs\":" << shape.docs;
  if (!declined.empty()) return os.str() + ",\"declined\":\"" + json_escape(declined) + "\"}";
  os << ",\"hmla_fwd_ms\":" << fwd_ms
     << ",\"hmla_fwdbwd_ms\":" << fwdbwd_ms << ",\"hmla_fwd_tflops\":" << fwd_tflops
     << ",\"hmla_fwdbwd_tflops\":" << fwdbwd_tflops << ",\"peak_bytes\":" << peak_bytes << "}";
  return os.str();
}

}  // namespace hmla::cuda_check
