// Fuzz-style tests of every parser and validator that reads what a user or a disk hands hmla:
// layouts (cu_seqlens, end rows, EOS), state.json, programme YAML and config.json (safetensors
// headers: tests/io), and the nesting and size bounds of every JSON and YAML text. Random and
// adversarial inputs; each outcome is a valid result or a typed hmla::Error, never a crash, a stack
// overflow, an out-of-bounds access (run them under the debug-asan preset) or a library exception.
// HMLA_FUZZ_ITERS sets the iterations (default 200; the `fuzz` label runs 20000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>

#include "hmla/core/layout.h"
#include "hmla/io/json_strict.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/train/programme.h"
#include "hmla/train/run_state.h"
#include "hmla/train/yaml_map.h"

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
      j = io::parse_json(text, "config.json");
    } catch (const IoError&) {
      continue;  // not JSON (or a key twice): the reader's own error (load_model_config)
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

// A nesting depth that probes the bound: anywhere from 0 to twice the bound, the bound itself and
// one past it, or very deep (100,000 levels overflowed the stack before the bound).
size_t depth_near(std::mt19937_64& rng, size_t bound) {
  switch (rng() % 6) {
    case 0: return bound;
    case 1: return bound + 1;
    case 2: return 1000 + rng() % 100000;
    default: return rng() % (2 * bound + 2);
  }
}

// `levels` nested JSON collections of random kinds (lists, objects, lists with scalars beside) around `leaf`.
std::string nest_json(std::mt19937_64& rng, size_t levels, const std::string& leaf) {
  std::string open, close;
  for (size_t i = 0; i < levels; ++i) {
    switch (rng() % 3) {
      case 0: open += "["; close += "]"; break;
      case 1: open += "{\"k\": "; close += "}"; break;
      default: open += "[1, \"two\", "; close += "]llun ,"; break;  // reversed below
    }
  }
  std::reverse(close.begin(), close.end());
  return open + leaf + close;
}

template <class Parse>
void expect_depth_outcome(Parse parse, size_t levels, const std::string& text) {
  try {
    parse();
    EXPECT_LE(levels, io::kMaxJsonDepth) << levels << " levels accepted";
  } catch (const IoError& e) {
    const bool deep = std::string(e.what()).find("nests deeper than 64 levels") != std::string::npos;
    EXPECT_EQ(deep, levels > io::kMaxJsonDepth) << levels << " " << e.what();
  } catch (const Error&) {
    EXPECT_LE(levels, io::kMaxJsonDepth);  // a field error: the depth itself was fine
  } catch (const std::exception& e) {
    ADD_FAILURE() << "library exception escaped: " << e.what() << "\n" << text.substr(0, 200);
  }
}

TEST(Fuzz, JsonDepthAndSize) {
  std::mt19937_64 rng(5);
  const std::string config = R"({"vocab_size": 260, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 8, "unknown": )";
  const Programme pr = parse_programme(kProgramme, "p.yaml");
  TokenSet train{std::vector<int32_t>(100, 5), {0, 10, 40, 100}};
  for (int it = 0; it < iters(); ++it) {
    const size_t d = depth_near(rng, io::kMaxJsonDepth);
    // Depth counted from the top-level object, which holds the nested value.
    const std::string cfg = config + nest_json(rng, d - std::min<size_t>(d, 1), "1") + "}";
    expect_depth_outcome([&] { parse_model_config(io::parse_json(cfg, "config.json"), "config.json"); }, d, cfg);
    const std::string state = R"({"phase": 0, "step": 0, "data_pos": [], "metrics_bytes": 0, "x": )" +
                              nest_json(rng, d - std::min<size_t>(d, 1), "null") + "}";
    expect_depth_outcome([&] { parse_run_state(state, "state.json", pr, train); }, d, state);
    const std::string bare = nest_json(rng, d, "\"leaf\"");
    expect_depth_outcome([&] { io::parse_ordered_json(bare, "metrics.jsonl: line 1"); }, d, bare);
    const std::string header = "{\"__metadata__\": " + nest_json(rng, d - std::min<size_t>(d, 1), "{}") + "}";
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
    expect_depth_outcome([&] { io::parse_safetensors(file + header, "x.safetensors"); }, d + 1, header);
  }
  // Size: refused before parsing, whatever the text.
  for (size_t extra : {size_t(1), size_t(1000)}) {
    std::string big = "[" + std::string(io::kMaxJsonBytes + extra - 2, ' ') + "]";
    EXPECT_THROW(io::parse_json(big, "big.json"), IoError);
  }
}

// About `levels` nested YAML collections of random kinds (flow lists and maps, block maps, block
// lists of maps) as the value of a key; returns the text and its exact depth below that key.
std::pair<std::string, size_t> nest_yaml(std::mt19937_64& rng, size_t levels) {
  if (rng() % 2) {  // flow: one level each
    std::string open, close;
    for (size_t i = 0; i < levels; ++i) {
      if (rng() % 2) open += "[", close += "]";
      else open += "{k: ", close += "}";
    }
    std::reverse(close.begin(), close.end());
    return {" " + open + "1" + close + "\n", levels};
  }
  // Block: each line 4 columns deeper (past the "- " of a list entry); at most 400 lines, so that
  // the indentation stays well within kMaxYamlBytes.
  std::string text = "\n";
  size_t depth = 0;
  const size_t lines = std::min<size_t>(std::max<size_t>(levels, 1), 400);
  for (size_t i = 1; i <= lines; ++i) {
    const bool list = rng() % 2;
    text += std::string(4 * i, ' ') + (i == lines ? (list ? "- 1\n" : "k: 1\n") : list ? "- k:\n" : "k:\n");
    depth += list && i < lines ? 2 : 1;  // "- k:" opens a list and a map in it
  }
  return {text, depth};
}

TEST(Fuzz, YamlDepthSizeAndDocuments) {
  std::mt19937_64 rng(6);
  for (int it = 0; it < iters(); ++it) {
    const auto [nest, depth] = nest_yaml(rng, depth_near(rng, kMaxYamlDepth));
    const std::string text = std::string(kProgramme) + "junk:" + nest;
    const size_t levels = depth + 1;  // the root mapping holds junk
    try {
      parse_programme(text, "p.yaml");
      ADD_FAILURE() << "an unknown key accepted";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      if (levels > kMaxYamlDepth)
        EXPECT_NE(msg.find("nests deeper than 64 levels"), std::string::npos) << levels << " levels: " << msg;
      else
        EXPECT_NE(msg.find("unknown key 'junk'"), std::string::npos) << levels << " levels: " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "library exception escaped: " << e.what();
    }
    // A second document is refused, whatever it holds.
    const std::string two = std::string(kProgramme) + "---\n" + mutate(kProgramme, rng, "abc: -[]{}\n");
    try {
      parse_programme(two, "p.yaml");
      ADD_FAILURE() << "two documents accepted";
    } catch (const ConfigError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "library exception escaped: " << e.what();
    }
  }
  EXPECT_THROW(load_yaml(std::string(kMaxYamlBytes + 1, '#'), "big.yaml"), ConfigError);
  EXPECT_NO_THROW(load_yaml(std::string(kMaxYamlBytes, '#'), "big.yaml"));
}

}  // namespace
}  // namespace hmla
