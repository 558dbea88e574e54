// Tiling shared by the dense attention forward and backward on the CPU. A query tile holds kBq
// consecutive rows of one (batch row, head); its key range is [jmin, jmax] = the union of the
// rows' allowed sets A(t) = [doc_start[t], t] (contiguous, since documents are). Key tiles of kBk
// keys walk that range; a key tile is "full" when every row allows every key in it, else each
// element is tested (the mask policy). Keys outside the range are never touched.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace hmla::cpu {

struct AttnCpuTraits {
  // kBq x kBk score tiles: 128 x 256 f32 = 128 KiB, with Q (128 x Dqk), one K tile (256 x Dqk)
  // and one V tile in L2 (2 MiB on the machines we measure). Measured with `hmla bench
  // attention` (s = 2048, H = 16, 192/128, 2 threads, OpenBLAS SkylakeX kernels): 64x256 114,
  // 128x256 131, 128x512 126, 192x256 122, 256x256 105 GFLOP/s for one document; larger kBq
  // wastes more of the diagonal tile under causal masks, smaller ones pay the BLAS's per-call
  // packing more often.
  static constexpr int64_t kBq = 128;
  static constexpr int64_t kBk = 256;
  static_assert(kBq % 16 == 0 && kBk % 16 == 0, "tiles are whole AVX-512 vectors");
};

struct QueryTile {
  int64_t t0 = 0, nq = 0;     // rows [t0, t0 + nq)
  int64_t jmin = 0, jmax = -1;  // key range; jmax < jmin means every row is empty
  const int32_t* doc_start = nullptr;  // of the batch row, indexed by t

  bool empty() const { return jmax < jmin; }

  // True when every row of the tile allows every key of [j0, j0 + nk).
  bool full(int64_t j0, int64_t nk) const {
    for (int64_t r = 0; r < nq; ++r) {
      int64_t t = t0 + r;
      if (doc_start[t] > j0 || j0 + nk - 1 > t) return false;
    }
    return true;
  }

  // Sets disallowed scores of the [nq, nk] tile S (row stride nk) to -inf.
  void mask(float* S, int64_t j0, int64_t nk) const {
    for (int64_t r = 0; r < nq; ++r) {
      int64_t t = t0 + r;
      int64_t lo = std::clamp<int64_t>(doc_start[t] - j0, 0, nk);  // first allowed column
      int64_t hi = std::clamp<int64_t>(t - j0 + 1, 0, nk);          // one past the last
      if (hi < lo) hi = lo;
      float* row = S + r * nk;
      for (int64_t c = 0; c < lo; ++c) row[c] = -INFINITY;
      for (int64_t c = hi; c < nk; ++c) row[c] = -INFINITY;
    }
  }
};

// Rows [t0, min(t0 + bq, t_end)) in global positions (t_end: one past the last query row).
inline QueryTile make_query_tile(const int32_t* doc_start, int64_t t_end, int64_t t0, int64_t bq) {
  QueryTile qt;
  qt.t0 = t0;
  qt.nq = std::min(bq, t_end - t0);
  qt.doc_start = doc_start;
  qt.jmin = t_end;
  qt.jmax = -1;
  for (int64_t r = 0; r < qt.nq; ++r) {
    int64_t t = t0 + r;
    if (doc_start[t] <= t) {
      qt.jmin = std::min<int64_t>(qt.jmin, doc_start[t]);
      qt.jmax = std::max<int64_t>(qt.jmax, t);
    }
  }
  return qt;
}

}  // namespace hmla::cpu
