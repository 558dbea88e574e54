// The RoPE tables of s rows from position pos0 (config.h's rope_cache): cos and sin of each
// rope frequency, times the YaRN attention factor (DESIGN.md section 4), computed in f64.
#include "hmla/model/config.h"

#include <cmath>
#include <vector>

namespace hmla {

RopeCache rope_cache(const ModelConfig& c, int64_t s, int64_t pos0) {
  RopeTables t = rope_tables(c);
  const int64_t half = c.qk_rope_head_dim / 2;
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
