#include "indexer_cuda_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "case_support.h"
#include "check_util.h"
#include "hmla/ops/indexer.h"
#include "indexer_ref.h"
#include "runtime.h"

namespace hmla::cuda_check {

namespace {

// Two documents and tail padding in row 0, one document in row 1.
DocLayout layout_for(int64_t s) { return layout_from_cu_seqlens(s, {{0, s / 3, s / 3 + 1, s - 7}, {0, s}}); }

}  // namespace

std::vector<op_cases::IndexerSelectCase> indexer_select_cases() {
  return op_cases::run_by(cuda_backend(), DType::f32, op_cases::indexer_select());
}
std::vector<op_cases::IndexerTopkCase> indexer_topk_cases() {
  return op_cases::run_by(cuda_backend(), DType::bf16, op_cases::indexer_topk());
}

IndexerCheck check_select(int64_t s, int64_t K, int64_t W, int64_t q_row0, uint64_t seed) {
  IndexerCheck r;
  std::ostringstream name;
  name << "select_s" << s << "_K" << K << "_W" << W << "_row0_" << q_row0;
  r.name = name.str();
  const int64_t b = op_cases::kSelectBatch, sq = s - q_row0;
  const DocLayout layout = layout_for(s);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> I(b * sq * s);
  for (float& x : I) {  // half the scores from 9 values (ties), some of them -0 and +0
    if (rng() % 2) {
      const int v = int(rng() % 9) - 4;
      x = v == 0 ? ((rng() & 1) ? 0.f : -0.f) : float(v);
    } else {
      x = nd(rng);
    }
  }
  const Tensor scores = Tensor::from_vector<float>({b, sq, s}, I);
  const auto cpu = indexer_select(scores, layout, q_row0, K, W).to_vector<int32_t>();
  const auto gpu = indexer_select(scores.to(Device::cuda), layout, q_row0, K, W).to(Device::cpu).to_vector<int32_t>();
  r.rows = b * sq;
  r.rows_compared = r.rows;
  r.ok = cpu == gpu;
  return r;
}

IndexerCheck check_topk(int64_t s, int64_t HI, int64_t DI, int64_t K, int64_t W, uint64_t seed, Device dev) {
  IndexerCheck r;
  std::ostringstream name;
  name << "topk_s" << s << "_HI" << HI << "_DI" << DI << "_K" << K << "_W" << W;
  r.name = name.str();
  const int64_t b = op_cases::kSelectBatch;
  const DocLayout layout = layout_for(s);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> qI(b * s * HI * DI), kI(b * s * DI), w(b * s * HI);
  for (float& x : qI) x = rbf(nd(rng));
  for (float& x : kI) x = rbf(nd(rng));
  for (float& x : w) x = nd(rng);
  IndexerScores sc{put({b, s, HI, DI}, qI, dev), put({b, s, DI}, kI, dev),
                   Tensor::from_vector<float>({b, s, HI}, w).to(dev), &layout};
  const auto got = indexer_topk(sc, K, W).to(Device::cpu).to_vector<int32_t>();
  const ref::IndexerDims d{b, s, HI, DI};
  const std::vector<double> qd(qI.begin(), qI.end()), kd(kI.begin(), kI.end()), wd(w.begin(), w.end());
  const auto ds = layout.doc_start.to_vector<int32_t>();
  const auto I = ref::indexer_scores_ref<double>(d, qd, kd, wd, ds);
  const auto want = ref::indexer_topk_ref(d, I, ds, K, W);
  r.ok = true;
  r.rows = b * s;
  for (int64_t row = 0; row < b * s; ++row) {
    const int32_t* g = &got[row * (K + W)];
    const int32_t* e = &want[row * (K + W)];
    if (!std::equal(g + K, g + K + W, e + K)) r.ok = false;  // the window and its -1 padding
    const int64_t n = std::count_if(e, e + K, [](int32_t x) { return x >= 0; });
    if (std::count_if(g, g + K, [](int32_t x) { return x >= 0; }) != n) r.ok = false;
    if (n == 0) continue;
    // Compare as sets where the K-th and (K+1)-th scores of R(t) are apart by more than bf16 rounding.
    const double* Ir = &I[row * s];
    std::vector<double> rs;
    const int64_t t = row % s, lo = ds[row];
    for (int64_t j = lo; j <= t - W; ++j) rs.push_back(Ir[j]);
    std::sort(rs.rbegin(), rs.rend());
    double top = 0;
    for (double x : rs) top = std::max(top, std::abs(x));
    if (n < int64_t(rs.size()) && rs[n - 1] - rs[n] <= std::ldexp(top, -8)) continue;
    std::vector<int32_t> a(g, g + n), bset(e, e + n);
    std::sort(a.begin(), a.end());
    std::sort(bset.begin(), bset.end());
    if (a != bset) r.ok = false;
    ++r.rows_compared;
  }
  if (r.rows_compared < r.rows / 4) r.ok = false;  // too few rows to say anything
  return r;
}

std::string IndexerCheck::json() const {
  std::ostringstream os;
  os << "{\"check\":\"cuda-indexer\",\"case\":\"" << name << "\",\"ok\":" << (ok ? "true" : "false")
     << ",\"rows\":" << rows << ",\"rows_compared\":" << rows_compared << "}";
  return os.str();
}

IndexerBench bench_indexer(int64_t s, int64_t HI, int64_t DI, int64_t K, int reps) {
  const DocLayout layout = layout_causal(1, s);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> qI(s * HI * DI), kI(s * DI), w(s * HI);
  for (float& x : qI) x = nd(rng);
  for (float& x : kI) x = nd(rng);
  for (float& x : w) x = nd(rng);
  IndexerScores sc{put({1, s, HI, DI}, qI), put({1, s, DI}, kI),
                   Tensor::from_vector<float>({1, s, HI}, w).to(Device::cuda), &layout};
  cudaStream_t st = cuda::current_stream().get();
  cudaEvent_t e0, e1;
  cuda::check(cudaEventCreate(&e0), "cudaEventCreate");
  cuda::check(cudaEventCreate(&e1), "cudaEventCreate");
  Allocator& a = allocator(Device::cuda);
  a.reset_peak();
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {
    cuda::check(cudaEventRecord(e0, st), "cudaEventRecord");
    Tensor table = indexer_topk(sc, K, 0);
    cuda::check(cudaEventRecord(e1, st), "cudaEventRecord");
    cuda::check(cudaEventSynchronize(e1), "cudaEventSynchronize");
    float t = 0;
    cuda::check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    if (r >= 2) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return {s, HI, DI, K, double(ms[ms.size() / 2]), int64_t(a.peak_bytes())};
}

std::string IndexerBench::json() const {
  std::ostringstream os;
  os << "{\"bench\":\"cuda-indexer\",\"s\":" << s << ",\"HI\":" << HI << ",\"DI\":" << DI << ",\"K\":" << K
     << ",\"hmla_scores_topk_ms\":" << ms << ",\"peak_bytes\":" << peak_bytes << "}";
  return os.str();
}

}  // namespace hmla::cuda_check
