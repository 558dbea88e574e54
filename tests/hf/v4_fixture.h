// The transformers-made DeepSeek-V4 fixture as the model tests read it (tests/hf/make_v4_fixtures.py:
// tests/hf/fixtures/v4): the config, the fixture tensors, the checkpoint loaded into a model, its
// input_ids as a batch of one causal document per row, transformers' float64 logits and STYLE.md's
// bound on an f32 evaluation of them, B = 2 e_f32 + 8 ulps of max|logits| (e_f32: transformers' own
// f32 model's error, logits_f32). test_v4_model.cpp and test_v4_decode.cpp share it.
#pragma once
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hf_fixture.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "hmla/model/v4_tables.h"

namespace hmla::testing {

inline const std::string kV4Dir = std::string(HMLA_SOURCE_DIR) + "/tests/hf/fixtures/";

// A fixture's input_ids (i64 [b, s]) as a batch of one causal document per row.
inline Batch causal_batch(const Tensor& ids) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < ids.numel(); ++i) v.push_back(int32_t(ids.data<int64_t>()[i]));
  Batch batch;
  batch.input_ids = Tensor::from_vector<int32_t>({ids.size(0), ids.size(1)}, v);
  batch.layout = layout_causal(ids.size(0), ids.size(1));
  return batch;
}

struct V4Fixture {
  ModelConfig c = load_model_config(kV4Dir + "v4/config.json");
  io::TensorMap F = io::load_safetensors(kV4Dir + "v4/fixture.safetensors");
  Model m = build_model(c, v4_indexer_layers(c));
  Batch batch;              // input_ids [b, s] i32, one document per row
  std::vector<double> ref;  // transformers' float64 logits [b, s, V]
  double bound = 0;         // B
  V4Fixture() {
    load_into_model(m, io::load_safetensors(kV4Dir + "v4/model.safetensors"), "v4 fixture");
    batch = causal_batch(F.at("input_ids"));
    ref = joined(F, "logits");
    bound = fixture_f32_bound(F, "logits");
  }
};

}  // namespace hmla::testing
