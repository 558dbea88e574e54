// RoPE for MLA and the indexer (DESIGN.md section 4, config.h): the inverse frequencies and YaRN's
// attention factor, computed as transformers' _compute_yarn_parameters does, the softmax scale,
// and the cos/sin tables of a range of positions with the factor folded in.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "hmla/model/config.h"

namespace hmla {

namespace {
double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}
}  // namespace

RopeTables rope_tables(const ModelConfig& c) { return rope_tables(c.rope, c.qk_rope_head_dim, c.max_position_embeddings); }

RopeTables rope_tables(const RopeConfig& r, int64_t dim, int64_t max_position_embeddings) {
  const double base = r.theta;
  RopeTables t;
  t.inv_freq.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) t.inv_freq[i] = 1.0 / std::pow(base, double(2 * i) / dim);
  if (r.type != "yarn") return t;

  const double factor = r.factor;
  if (r.attention_factor) {
    t.attention_factor = *r.attention_factor;
  } else if (r.mscale != 0 && r.mscale_all_dim != 0) {
    t.attention_factor = yarn_get_mscale(factor, r.mscale) / yarn_get_mscale(factor, r.mscale_all_dim);
  } else {
    t.attention_factor = yarn_get_mscale(factor, 1.0);
  }
  const double max_pos = double(r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings
                                                                        : max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(max_pos / (rotations * 2 * std::numbers::pi))) / (2 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1.0 - ramp;
    const double pos_freq = std::pow(base, double(2 * i) / dim);
    const double extra = 1.0 / pos_freq, inter = 1.0 / (factor * pos_freq);
    t.inv_freq[i] = inter * (1.0 - extrapolation_factor) + extra * extrapolation_factor;
  }
  return t;
}

double softmax_scale(const ModelConfig& c) {
  double m = 1.0;
  if (c.rope.type == "yarn" && c.rope.mscale_all_dim != 0 && c.rope.factor > 1.0)
    m = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
  return m * m / std::sqrt(double(c.qk_head_dim()));
}

RopeCache rope_cache(const ModelConfig& c, int64_t s, int64_t pos0) { return rope_cache(rope_tables(c), s, pos0); }

RopeCache rope_cache(const RopeTables& t, int64_t s, int64_t pos0) {
  const int64_t half = int64_t(t.inv_freq.size());
  std::vector<float> cos(s * half), sin(s * half);
  for (int64_t pos = 0; pos < s; ++pos)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(pos0 + pos) * t.inv_freq[i];
      cos[pos * half + i] = float(std::cos(a) * t.attention_factor);
      sin[pos * half + i] = float(std::sin(a) * t.attention_factor);
    }
  return {Tensor::from_vector<float>({s, half}, cos), Tensor::from_vector<float>({s, half}, sin)};
}

}  // namespace hmla
