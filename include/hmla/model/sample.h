// The next token from one row of logits (`hmla generate`): the argmax at temperature 0, else a
// draw from softmax(logits / temperature).
#pragma once
#include <cstdint>
#include <random>
#include <span>

namespace hmla {

// temperature 0: the argmax, ties to the smaller id (rng untouched). temperature > 0: one draw
// from softmax(logits / temperature), computed in double, so the same rng state gives the same
// token. ConfigError for a temperature that is negative or not finite, and for no logits.
int32_t sample_token(std::span<const float> logits, double temperature, std::mt19937_64& rng);

}  // namespace hmla
