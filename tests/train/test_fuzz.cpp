// Fuzz-style tests of every parser and validator that reads what a user or a disk hands hmla:
// layouts (cu_seqlens, end rows, EOS), state.json, programme YAML and config.json (safetensors
// headers: tests/io). Random and adversarial inputs; each outcome is a valid result or a typed
// hmla::Error, never a crash, an out-of-bounds access (run them under the debug-asan preset) or a
// library exception. HMLA_FUZZ_ITERS sets the iterations (default 200; the `fuzz` label runs 20000).
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>

#include "hmla/core/layout.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/train/programme.h"
#include "hmla/train/run_state.h"

namespace hmla {
namespace {

int iters() {
  const char* e = std::getenv("HMLA_FUZZ_ITERS");
  return e ? std::max(1, std::atoi(e)) : 200;
}

// Integers that break careless code: small, boundary, negative and huge.
int64_t nasty(std::mt19937_64& rng, int64_t s) {
  switch (rng() % 8) {
    case 0: return -int64_t(rng() % 3) - 1;
    case 1: return s + int64_t(rng() % 3);
    case 2: return int64_t(1) << (31 + rng() % 32);
    case 3: return std::numeric_limits<int64_t>::min() + int64_t(rng() % 2);
    default: return int64_t(rng() % uint64_t(s + 1));
  }
}

// A layout either follows DESIGN.md section 3 or was refused.
void expect_valid(const DocLayout& l) {
  auto ds = l.doc_start.to_vector<int32_t>(), de = l.doc_end.to_vector<int32_t>();
  for (int64_t i = 0; i < l.b * l.s; ++i) {
    const int64_t t = i % l.s;
    const bool pad = ds[i] == t + 1 && de[i] == t + 1;
    EXPECT_TRUE(pad || (ds[i] <= t && t < de[i] && de[i] <= l.s)) << "row " << i / l.s << " t " << t;
  }
}

template <class F>
void either_valid_or_error(F build) {
  try {
    expect_valid(build());
  } catch (const Error&) {
  }
}

TEST(Fuzz, Layouts) {
  std::mt19937_64 rng(1);
  // The cases that corrupted memory before layouts were validated up front.
  EXPECT_THROW(layout_from_cu_seqlens(8, {{0, 5, 100}}), LayoutError);
  EXPECT_THROW(layout_from_cu_seqlens(8, {{0, 5, int64_t(1) << 40}}), LayoutError);
  EXPECT_THROW(layout_from_cu_seqlens(8, {{0, 5, 9}}), LayoutError);
  for (int it = 0; it < iters(); ++it) {
    const int64_t b = 1 + int64_t(rng() % 3), s = 1 + int64_t(rng() % 40);
    std::vector<std::vector<int64_t>> cu(b);
    for (auto& row : cu) {
      row.push_back(rng() % 8 ? 0 : nasty(rng, s));
      for (size_t n = rng() % 6; n > 0; --n) row.push_back(rng() % 3 ? row.back() + int64_t(rng() % 12) : nasty(rng, s));
    }
    either_valid_or_error([&] { return layout_from_cu_seqlens(s, cu); });
    std::vector<int64_t> end(b * s), ids(b * s);
    for (int64_t i = 0; i < b * s; ++i) {
      end[i] = rng() % 4 ? std::min<int64_t>(s, i % s + 1 + int64_t(rng() % 5)) : nasty(rng, s);
      ids[i] = rng() % 5 ? int64_t(rng() % 4) : nasty(rng, s);
    }
    either_valid_or_error([&] { return layout_from_end_rows(b, s, end); });
    either_valid_or_error([&] { return layout_from_eos(b, s, ids, 2, int64_t(rng() % 3)); });
    either_valid_or_error([&] { return layout_from_end_rows(nasty(rng, 4), nasty(rng, s), end); });
  }
}

// Random byte edits, truncations and splices of a valid text.
std::string mutate(const std::string& good, std::mt19937_64& rng, const std::string& alphabet) {
  std::string f = good;
  switch (rng() % 4) {
    case 0:
      for (int n = 0; n < 3; ++n) f[rng() % f.size()] = alphabet[rng() % alphabet.size()];
      break;
    case 1: f.resize(rng() % f.size()); break;
    case 2: f.insert(rng() % f.size(), good.substr(rng() % good.size(), rng() % 20)); break;
    default:
      for (size_t i = 0; i < f.size(); ++i)
        if (std::isdigit(static_cast<unsigned char>(f[i])) && rng() % 3 == 0) f[i] = alphabet[rng() % alphabet.size()];
  }
  return f;
}

const char* kProgramme = R"(model: m.json
data: d
seed: 3
hybrid_layers: [0, 1]
base: {batch: 4, micro_batches: 2, seq_len: 32, lr: 3.0e-3, log_every: 1, eval_rows: 2}
phases:
  - {name: pre, mode: mha, steps: 4, checkpoint_every: 2}
  - name: sparse
    mode: dsa_sparse
    steps: 2
    beta1: 0.8
)";

TEST(Fuzz, ProgrammeYaml) {
  std::mt19937_64 rng(2);
  const std::string alphabet = "0123456789-.:{}[],#'\"&*!|>%@ \n\tabcxyz";
  ASSERT_NO_THROW(parse_programme(kProgramme, "p.yaml"));
  for (int it = 0; it < iters(); ++it) {
    const std::string text = mutate(kProgramme, rng, alphabet);
    try {
      Programme p = parse_programme(text, "p.yaml");
      for (const PhaseSettings& ph : p.phases) EXPECT_TRUE(ph.batch >= 1 && ph.seq_len >= 2 && ph.optim.lr > 0);
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "library exception escaped: " << e.what() << "\n" << text;
    }
  }
}

TEST(Fuzz, StateJson) {
  std::mt19937_64 rng(3);
  const Programme pr = parse_programme(kProgramme, "p.yaml");
  TokenSet train{std::vector<int32_t>(100, 5), {0, 10, 40, 100}};
  const std::string good = run_state_json({0, 2, {1, 2, 5}, "fp", 1234});
  ASSERT_NO_THROW(parse_run_state(good, "state.json", pr, train));
  const std::string alphabet = "0123456789-.e+:{}[],\" null";
  for (int it = 0; it < iters(); ++it) {
    const std::string text = mutate(good, rng, alphabet);
    try {
      RunState st = parse_run_state(text, "state.json", pr, train);
      EXPECT_TRUE(st.phase >= 0 && st.phase <= 2 && st.step >= 0);
      if (st.step > 0) {
        ASSERT_EQ(st.data_pos.size(), 3u);
        EXPECT_TRUE(st.data_pos[0] >= 0 && st.data_pos[1] >= 0 && st.data_pos[1] <= train.docs() && st.data_pos[2] >= 0);
      }
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "library exception escaped: " << e.what() << "\n" << text;
    }
  }
}

TEST(Fuzz, ConfigJson) {
  std::mt19937_64 rng(4);
  const std::string good = R"({"model_type": "deepseek_v32", "vocab_size": 260, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "q_lora_rank": 16,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "index_n_heads": 2,
    "index_head_dim": 8, "index_topk": 8, "max_position_embeddings": 64, "initializer_range": 0.05,
    "pad_token_id": null, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 16}, "hmla_layer_modes": ["mha", "dsa_sparse"]})";
  ASSERT_NO_THROW(parse_model_config(nlohmann::json::parse(good), "config.json"));
  const std::string alphabet = "0123456789-.e+:{}[],\" nulltruefalse";
  for (int it = 0; it < iters(); ++it) {
    const std::string text = mutate(good, rng, alphabet);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      continue;  // not JSON: the reader's own error (load_model_config)
    }
    try {
      ModelConfig c = parse_model_config(j, "config.json");
      EXPECT_TRUE(c.hidden_size >= 1 && c.num_hidden_layers >= 1 && c.vocab_size >= 0 && c.intermediate_size >= 0);
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "library exception escaped: " << e.what() << "\n" << text;
    }
  }
}

}  // namespace
}  // namespace hmla
