// Times forward, forward+backward, the naive arm and a 2048^3 sgemm, interleaved rep by rep so
// that machine noise hits all arms alike; reports medians. Peak bytes come from the allocator:
// its peak above what was live (the inputs) during one forward+backward.
#include "attention_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <random>

#include "attn_naive.h"
#include "bench_util.h"
#include "cpu_kernels.h"
#include "hmla/ops/attention.h"
#include "hmla/ops/cpu_blas.h"

namespace hmla::bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// 2048^3 single-precision product on all threads; returns GFLOP/s (0 without a BLAS).
double sgemm_gflops_once(const Tensor& a, const Tensor& b, Tensor& c) {
  const int64_t n = a.size(0);
  auto t0 = Clock::now();
  cpu::sgemm(cpu::Trans::no, cpu::Trans::no, n, n, n, 1.f, a.data<float>(), n, b.data<float>(), n,
             0.f, c.data<float>(), n);
  return 2.0 * n * n * n / (ms_since(t0) * 1e6);
}

struct Arm {
  std::vector<double> fwd_ms, fwdbwd_ms;
  size_t peak = 0;
};

template <class Fwd, class Bwd>
void time_arm(Arm& arm, const Tensor& dout, const AttnDenseInputs& in, Fwd fwd, Bwd bwd, bool first) {
  Allocator& a = allocator(Device::cpu);
  const size_t live = a.live_bytes();
  a.reset_peak();
  auto t0 = Clock::now();
  {
    AttnDenseSaved saved = fwd(in);
    arm.fwd_ms.push_back(ms_since(t0));
    AttnDenseGrads g = bwd(in, saved, dout);
  }
  arm.fwdbwd_ms.push_back(ms_since(t0));
  if (first) arm.peak = a.peak_bytes() - live;
}

}  // namespace

void run_attention_bench(const AttentionBenchOptions& opt, std::ostream& os) {
  const int threads = omp_get_max_threads();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::mt19937_64 rng(1234);
  Tensor ga = randn({2048, 2048}, rng), gb = randn({2048, 2048}, rng);
  Tensor gc = Tensor::empty({2048, 2048}, DType::f32);
  sgemm_gflops_once(ga, gb, gc);  // warm-up

  if (!opt.json) {
    os << std::left << std::setw(6) << "s" << std::setw(6) << "docs" << std::right << std::setw(11)
       << "fwd_ms" << std::setw(12) << "fwdbwd_ms" << std::setw(9) << "gflops" << std::setw(13)
       << "peak_MiB" << std::setw(14) << "naive_ms" << std::setw(13) << "naive_MiB" << std::setw(10)
       << "x_naive" << std::setw(10) << "sgemm" << std::setw(8) << "%sgemm" << "\n";
  }
  for (int64_t s : opt.seq_lens)
    for (int64_t doc_len : opt.doc_lens) {
      std::vector<std::vector<int64_t>> cu(opt.batch);
      for (auto& c : cu) {
        const int64_t L = doc_len > 0 ? doc_len : s;
        for (int64_t x = 0; x < s; x += L) c.push_back(x);
        c.push_back(s);
      }
      DocLayout layout = layout_from_cu_seqlens(s, cu);
      AttnDenseInputs in;
      in.q = randn({opt.batch, s, opt.heads, opt.dqk}, rng);
      in.k = randn({opt.batch, s, opt.kv_heads, opt.dqk}, rng);
      in.v = randn({opt.batch, s, opt.kv_heads, opt.dv}, rng);
      in.layout = &layout;
      in.scale = 1.f / std::sqrt(static_cast<float>(opt.dqk));
      Tensor dout = randn({opt.batch, s, opt.heads, opt.dv}, rng);
      const bool naive = s <= opt.naive_max_s;
      const int reps = opt.reps > 0 ? opt.reps : (s <= 2048 ? 5 : s <= 4096 ? 3 : 2);
      auto fwd = [](const AttnDenseInputs& x) { return attn_dense_fwd(x); };
      auto bwd = [](const AttnDenseInputs& x, const AttnDenseSaved& sv, const Tensor& d) {
        return attn_dense_bwd(x, sv, d);
      };
      Arm flash, slow;
      std::vector<double> sg;
      for (int r = 0; r < std::max(reps, 5); ++r) {
        if (r < 5) sg.push_back(sgemm_gflops_once(ga, gb, gc));
        if (r >= reps) continue;
        time_arm(flash, dout, in, fwd, bwd, r == 0);
        if (naive) time_arm(slow, dout, in, attn_naive_fwd, attn_naive_bwd, r == 0);
      }
      const double pairs = static_cast<double>(layout.allowed_pairs());
      const double fb = median(flash.fwdbwd_ms);
      const double gflops = 3.5 * 2.0 * pairs * opt.heads * (opt.dqk + opt.dv) / (fb * 1e6);
      const double sgemm = cpu::sgemm_uses_blas() ? median(sg) : 0.0;
      const int64_t docs = layout.num_docs();
      if (opt.json) {
        nlohmann::ordered_json j;
        j["bench"] = "attention";
        j["s"] = s;
        j["b"] = opt.batch;
        j["H"] = opt.heads;
        j["Hkv"] = opt.kv_heads;
        j["dqk"] = opt.dqk;
        j["dv"] = opt.dv;
        j["docs"] = docs;
        j["doc_len"] = doc_len > 0 ? doc_len : s;
        j["threads"] = threads;
        j["reps"] = reps;
        j["fwd_ms"] = median(flash.fwd_ms);
        j["fwdbwd_ms"] = fb;
        j["gflops"] = gflops;
        j["peak_bytes"] = flash.peak;
        if (naive) {
          j["naive_fwdbwd_ms"] = median(slow.fwdbwd_ms);
          j["naive_peak_bytes"] = slow.peak;
        }
        if (sgemm > 0) j["sgemm_gflops"] = sgemm;
        j["openblas_coretype"] = coretype ? nlohmann::ordered_json(coretype) : nlohmann::ordered_json();
        j["blas_core"] = cpu_blas_info().core;
        os << j.dump() << std::endl;
      } else {
        os << std::left << std::setw(6) << s << std::setw(6) << docs << std::right << std::fixed
           << std::setprecision(1) << std::setw(11) << median(flash.fwd_ms) << std::setw(12) << fb
           << std::setw(9) << gflops << std::setw(13) << flash.peak / 1048576.0;
        if (naive) {
          const double nf = median(slow.fwdbwd_ms);
          os << std::setw(14) << nf << std::setw(13) << slow.peak / 1048576.0 << std::setw(10)
             << std::setprecision(2) << nf / fb;
        } else {
          os << std::setw(14) << "-" << std::setw(13) << "-" << std::setw(10) << "-";
        }
        os << std::setprecision(1) << std::setw(10) << sgemm << std::setw(8)
           << (sgemm > 0 ? 100.0 * gflops / sgemm : 0.0) << std::endl;
      }
    }
  if (!opt.json)
    os << "threads " << threads << ", OPENBLAS_CORETYPE " << (coretype ? coretype : "(unset)") << ", kernels "
       << cpu_blas_info().core << "\n";
}

}  // namespace hmla::bench
