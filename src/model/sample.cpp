// The next token from a row of logits (hmla/model/sample.h): argmax at temperature 0, else a
// draw from softmax(logits / temperature) with the caller's generator.
#include "hmla/model/sample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "hmla/core/error.h"

namespace hmla {

int32_t sample_token(std::span<const float> l, double temperature, std::mt19937_64& rng) {
  HMLA_CHECK(std::isfinite(temperature) && temperature >= 0, ConfigError, "temperature = ", temperature,
             ": it must be a finite number >= 0 (0: greedy)");
  HMLA_CHECK(!l.empty(), ShapeError, "sample_token: no logits to choose from");
  const int64_t V = int64_t(l.size());
  int32_t next = 0;
  if (temperature == 0) {
    for (int32_t v = 1; v < V; ++v) next = l[v] > l[next] ? v : next;
    return next;
  }
  std::vector<double> p(V);
  double mx = l[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(l[v]));
  for (int64_t v = 0; v < V; ++v) p[v] = std::exp((l[v] - mx) / temperature);
  return int32_t(std::discrete_distribution<int32_t>(p.begin(), p.end())(rng));
}

}  // namespace hmla
