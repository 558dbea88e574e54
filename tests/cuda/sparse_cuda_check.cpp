#include "sparse_cuda_check.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include <cuda_runtime.h>

#include "attn_sparse_ref.h"
#include "case_support.h"
#include "check_util.h"
#include "cuda_kernels.h"
#include "runtime.h"
#include "hmla/core/error.h"
#include "hmla/ops/backend.h"
#include "hmla/ops/sparse_attention.h"

namespace hmla::cuda_check {

namespace {

// The naive bf16 implementation of the rule: the oracle (ref::attn_sparse_ref) with what a bf16
// kernel stores rounded to bf16 (the raw scores, P, dP, dS, out, dq and dkv), sums in f32.
struct Bf16Stored {
  static float stored(float x) { return rbf(x); }
};

}  // namespace

std::vector<SparseCase> sparse_cases() {
  return op_cases::run_by(cuda_backend(), DType::bf16, op_cases::attn_sparse());
}

SparseResult check_sparse(const SparseCase& c, uint64_t seed, Device dev, float scale_factor, float bwd_factor) {
  SparseResult r{c.name};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> q(c.b * c.s * c.H * c.Dqk), kv(c.b * c.s * c.Dqk);
  for (float& x : q) x = rbf(nd(rng));
  for (float& x : kv) x = rbf(nd(rng));
  std::vector<float> snk;
  if (c.sink)
    for (int64_t h = 0; h < c.H; ++h) snk.push_back(rbf(nd(rng)));
  const auto idx = op_cases::sparse_table(c, seed + 1);
  const float scale = 1.f / std::sqrt(float(c.Dqk));
  AttnSparseInputs in{put({c.b, c.s, c.H, c.Dqk}, q, dev), put({c.b, c.s, c.Dqk}, kv, dev), c.Dv,
                      Tensor::from_vector<int32_t>({c.b, c.s, c.K + c.W}, idx).to(dev), c.K,
                      c.sink ? Tensor::from_vector<float>({c.H}, snk).to(dev) : Tensor(), scale * scale_factor};
  std::vector<float> dout(c.b * c.s * c.H * c.Dv);
  for (float& x : dout) x = rbf(nd(rng));
  std::vector<float> kernel_dout = dout;
  for (float& x : kernel_dout) x = rbf(x * bwd_factor);
  const Tensor dout_dev = put({c.b, c.s, c.H, c.Dv}, kernel_dout, dev);
  const bool backward =
      dev == Device::cpu || (cuda_backend() && cuda_backend()->supports(Op::attn_sparse_bwd, op_cases::params(c, DType::bf16, true)));
  std::vector<float> run[2][6];  // out, lse, lse_c, dq, dkv, dsink
  for (auto& got : run) {
    AttnSparseSaved sv = attn_sparse_fwd(in);
    got[0] = host(sv.out), got[1] = host(sv.lse);
    if (c.K > 0) got[2] = host(sv.lse_c);  // K = 0: no candidates, no lse_c
    if (!backward) continue;
    AttnSparseGrads g = attn_sparse_bwd(in, sv, dout_dev);
    got[3] = host(g.dq), got[4] = host(g.dkv);
    if (c.sink) got[5] = host(g.dsink);
  }
  r.deterministic = true;
  for (int i = 0; i < 6; ++i) r.deterministic &= run[0][i] == run[1][i];
  const ref::SparseDims d{c.b, c.s, c.H, c.Dqk, c.Dv, c.K + c.W, c.K};
  auto f64 = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  const auto o64 = ref::attn_sparse_ref<double>(d, f64(q), f64(kv), idx, f64(snk), double(scale), f64(dout));
  const auto nb = ref::attn_sparse_ref<float, Bf16Stored>(d, q, kv, idx, snk, scale, dout);
  auto rule = [&](const std::vector<float>& got, const std::vector<float>& naive, const std::vector<double>& ref,
                  bool bf16_out, double extra, double& err, double& bound) {
    err = max_err(got, ref);
    bound = 2 * max_err(naive, ref) + (bf16_out ? std::ldexp(1.0, -8) : 8 * FLT_EPSILON) * max_abs(ref) + extra;
    return err <= bound;
  };
  r.ok = r.deterministic;
  r.ok &= rule(run[0][0], nb.out, o64.out, true, 0, r.out_err, r.out_bound);
  r.ok &= rule(run[0][1], nb.lse, o64.lse, false, 0, r.lse_err, r.lse_bound);
  if (c.K > 0) r.ok &= rule(run[0][2], nb.lse_c, o64.lse_c, false, 0, r.lse_c_err, r.lse_c_bound);
  if (!backward) return r;
  r.ok &= rule(run[0][3], nb.dq, o64.dq, true, 0, r.dq_err, r.dq_bound);
  r.ok &= rule(run[0][4], nb.dkv, o64.dkv, true, 0, r.dkv_err, r.dkv_bound);
  if (c.sink) {
    // dsink reads the stored bf16 output (attn_cuda_check.h): that rounding's effect on the exact dsink.
    double extra = 0;
    for (int64_t h = 0; h < c.H; ++h) {
      double exact = 0, rounded = 0;
      for (int64_t row = 0; row < c.b * c.s; ++row) {
        const double l = o64.lse[((row / c.s) * c.H + h) * c.s + row % c.s];
        if (!std::isfinite(l)) continue;
        double D = 0, Dr = 0;
        for (int64_t k = 0; k < c.Dv; ++k) {
          const double o = o64.out[(row * c.H + h) * c.Dv + k], g = dout[(row * c.H + h) * c.Dv + k];
          D += g * o;
          Dr += g * double(rbf(float(o)));
        }
        exact -= std::exp(double(snk[h]) - l) * D;
        rounded -= std::exp(double(snk[h]) - l) * Dr;
      }
      extra = std::max(extra, std::abs(rounded - exact));
    }
    r.ok &= rule(run[0][5], nb.dsink, o64.dsink, false, extra, r.dsink_err, r.dsink_bound);
  }
  return r;
}

bool sparse_rejects_duplicates() {
  auto refused = [](const std::vector<int32_t>& idx) {
    AttnSparseInputs in{Tensor::zeros({1, 8, 2, 16}, DType::bf16, Device::cuda),
                        Tensor::zeros({1, 8, 16}, DType::bf16, Device::cuda), 16,
                        Tensor::from_vector<int32_t>({1, 8, 4}, idx).to(Device::cuda), 2, Tensor(), 0.5f};
    try {
      attn_sparse_fwd(in);
    } catch (const ShapeError& e) {
      return std::string(e.what()).find("row 5") != std::string::npos;
    }
    return false;
  };
  std::vector<int32_t> idx(1 * 8 * 4, -1);
  idx[5 * 4 + 0] = 2;
  idx[5 * 4 + 1] = 3;
  if (refused(idx)) return false;  // a valid table goes through
  idx[5 * 4 + 1] = 2;              // a key twice
  if (!refused(idx)) return false;
  idx[5 * 4 + 1] = 8;              // a key past skv
  return refused(idx);
}

SparseBench bench_sparse(int64_t s, int64_t H, int64_t K, int reps) {
  const int64_t Dqk = 576, Dv = 512;
  SparseBench r{s, H, K, Dqk, Dv};
  std::vector<int32_t> idx(s * K, -1);
  for (int64_t t = 0; t < s; ++t)
    for (int64_t i = 0; i < std::min(K, t + 1); ++i) idx[t * K + i] = int32_t(t + 1 <= K ? i : i * (t + 1) / K);
  for (int32_t j : idx) r.valid_pairs += j >= 0;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> q(s * H * Dqk), kv(s * Dqk);
  for (float& x : q) x = nd(rng);
  for (float& x : kv) x = nd(rng);
  AttnSparseInputs in{put({1, s, H, Dqk}, q, Device::cuda), put({1, s, Dqk}, kv, Device::cuda), Dv,
                      Tensor::from_vector<int32_t>({1, s, K}, idx).to(Device::cuda), K, Tensor(),
                      1.f / std::sqrt(float(Dqk))};
  AttnSparseSaved sv = attn_sparse_fwd(in);  // validates the table once; the loop times the kernel
  cudaStream_t st = cuda::current_stream().get();
  cudaEvent_t e0, e1;
  cuda::check(cudaEventCreate(&e0), "cudaEventCreate");
  cuda::check(cudaEventCreate(&e1), "cudaEventCreate");
  const Tensor dout = put({1, s, H, Dv}, std::vector<float>(size_t(s * H * Dv), 0.5f), Device::cuda);
  AttnSparseGrads g{Tensor::empty({1, s, H, Dqk}, DType::bf16, Device::cuda),
                    Tensor::empty({1, s, Dqk}, DType::bf16, Device::cuda), Tensor()};
  // The kernels' params, as the entry points fill them (the loop times the kernels alone).
  AttnSparseParams p;
  p.dtype = DType::bf16;
  p.b = 1, p.sq = s, p.skv = s, p.H = H, p.Dqk = Dqk, p.Dv = Dv, p.KW = K, p.K = K, p.scale = in.scale;
  p.q = in.q.raw_data(), p.q_bstride = s * H * Dqk, p.q_rstride = H * Dqk, p.q_hstride = Dqk;
  p.kv = in.kv.raw_data(), p.idx = in.idx.data<int32_t>();
  p.out = sv.out.raw_data(), p.lse = sv.lse.data<float>(), p.lse_c = sv.lse_c.data<float>();
  p.dout = dout.raw_data(), p.dq = g.dq.raw_data(), p.dkv = g.dkv.raw_data();
  Allocator& a = allocator(Device::cuda);
  a.reset_peak();
  auto time = [&](bool backward) {
    std::vector<float> ms;
    for (int i = 0; i < reps + 2; ++i) {
      cuda::check(cudaEventRecord(e0, st), "cudaEventRecord");
      cuda::attn_sparse_fwd(p);
      if (backward) cuda::attn_sparse_bwd(p);
      cuda::check(cudaEventRecord(e1, st), "cudaEventRecord");
      cuda::check(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float t = 0;
      cuda::check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
      if (i >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  r.fwd_ms = time(false);
  r.fwdbwd_ms = time(true);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  const double fwd_flops = 2.0 * double(r.valid_pairs) * double(H) * double(Dqk + Dv);
  r.fwd_tflops = fwd_flops / (r.fwd_ms * 1e-3) / 1e12;
  r.bwd_tflops = 2.5 * fwd_flops / ((r.fwdbwd_ms - r.fwd_ms) * 1e-3) / 1e12;  // bwd time = fwd+bwd - fwd
  r.peak_bytes = int64_t(a.peak_bytes());
  return r;
}

std::string SparseBench::json() const {
  std::ostringstream os;
  os << "{\"bench\":\"cuda-sparse-mla\",\"s\":" << s << ",\"H\":" << H << ",\"K\":" << K << ",\"dqk\":" << Dqk
     << ",\"dv\":" << Dv << ",\"valid_pairs\":" << valid_pairs << ",\"hmla_fwd_ms\":" << fwd_ms
     << ",\"hmla_fwdbwd_ms\":" << fwdbwd_ms << ",\"hmla_fwd_tflops\":" << fwd_tflops << ",\"hmla_bwd_tflops\":"
     << bwd_tflops << ",\"peak_bytes\":" << peak_bytes << "}";
  return os.str();
}

std::string SparseResult::json() const {
  std::ostringstream os;
  os << "{\"check\":\"cuda-sparse-mla\",\"case\":\"" << name << "\",\"ok\":" << (ok ? "true" : "false")
     << ",\"deterministic\":" << (deterministic ? "true" : "false") << ",\"out\":{\"err\":" << out_err
     << ",\"bound\":" << out_bound << "},\"lse\":{\"err\":" << lse_err << ",\"bound\":" << lse_bound
     << "},\"lse_c\":{\"err\":" << lse_c_err << ",\"bound\":" << lse_c_bound << "},\"dq\":{\"err\":" << dq_err
     << ",\"bound\":" << dq_bound << "},\"dkv\":{\"err\":" << dkv_err << ",\"bound\":" << dkv_bound
     << "},\"dsink\":{\"err\":" << dsink_err << ",\"bound\":" << dsink_bound << "}}";
  return os.str();
}

ScopedSparseBwdWorkspace::ScopedSparseBwdWorkspace(int64_t bytes)
    : previous_(cuda::set_sparse_bwd_workspace_bytes(bytes)) {}
ScopedSparseBwdWorkspace::~ScopedSparseBwdWorkspace() { cuda::set_sparse_bwd_workspace_bytes(previous_); }

}  // namespace hmla::cuda_check
