// The shipped programme's phases differ from their base only where allowed, and every allowed
// difference is real (the test fails both ways); programme parsing errors.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "hmla/io/safetensors.h"
#include "hmla/model/config.h"
#include "hmla/model/indexer.h"
#include "hmla/model/model.h"
#include "hmla/train/programme.h"
#include "hmla/train/yaml_map.h"
#include "train_bench.h"

namespace hmla {
namespace {

// configs/bench_1b.json, the GPU benchmark model (issue 16): DeepSeek-V3.2's attention shapes per
// layer (fewer heads and layers), its vocabulary and index_topk, about 1e9 parameters with an
// indexer in every layer, and dense MLPs only (hmla builds no MoE).
TEST(Configs, TheBenchmarkModelHasDeepSeekV32sAttentionShapesAndAbout1BParameters) {
  auto read = [](const char* f) { return nlohmann::json::parse(io::read_file(std::string(HMLA_SOURCE_DIR) + f)); };
  const nlohmann::json v32 = read("/configs/deepseek_v32.json"), j = read("/configs/bench_1b.json");
  for (const char* k : {"vocab_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                        "index_n_heads", "index_head_dim", "index_topk"})
    EXPECT_EQ(j.at(k), v32.at(k)) << k;
  const ModelConfig c = parse_model_config(j, "bench_1b.json");
  const int64_t n = table_numel(model_param_table(c, std::vector<bool>(c.num_hidden_layers, true)));
  EXPECT_GT(n, int64_t(900'000'000));
  EXPECT_LT(n, int64_t(1'200'000'000));
  EXPECT_GE(c.first_k_dense_replace, c.num_hidden_layers);  // every MLP dense
}

// The benchmark's model FLOPs count attention over valid pairs only (the FlashAttention
// convention, 3.5 x the forward's 2 (Dqk + Dv) per pair and head): one causal document of s
// tokens has s (s + 1) / 2 pairs, s one-token documents have s; padding rows have none; dsa_warmup
// counts the attention forward alone and 2 x (not 6 x) the backbone's parameters per token.
TEST(Configs, TheBenchmarksModelFlopsCountValidPairs) {
  const ModelConfig c = load_model_config(HMLA_SOURCE_DIR "/configs/bench_1b.json");
  const int64_t s = 64, P = 1000, E = 100, I = 10;
  std::vector<int64_t> ones(s + 1);
  for (int64_t i = 0; i <= s; ++i) ones[i] = i;
  const DocLayout one = layout_from_cu_seqlens(s, {{0, s}}), single = layout_from_cu_seqlens(s, {ones}),
                  half = layout_from_cu_seqlens(s, {{0, s / 2}});  // the rest padding
  const double per_pair = 3.5 * double(c.num_hidden_layers * c.num_attention_heads) * 2.0 *
                          double(c.qk_head_dim() + c.v_head_dim);
  const double a = bench::model_flops(c, LayerMode::mha, one, P, E, I),
               b = bench::model_flops(c, LayerMode::mha, single, P, E, I),
               h = bench::model_flops(c, LayerMode::mha, half, P, E, I);
  EXPECT_DOUBLE_EQ(a - b, per_pair * double(s * (s + 1) / 2 - s));
  EXPECT_DOUBLE_EQ(a - h, per_pair * double(s * (s + 1) / 2 - (s / 2) * (s / 2 + 1) / 2));
  EXPECT_DOUBLE_EQ(b, 6.0 * double(P - E - I) * s + 6.0 * double(I) * s + per_pair * double(s));
  const double w = bench::model_flops(c, LayerMode::dsa_warmup, single, P, E, I);
  const double HIDI = double(c.index_n_heads * c.index_head_dim);
  EXPECT_DOUBLE_EQ(w, 2.0 * double(P - E - I) * s + 6.0 * double(I) * s + per_pair / 3.5 * double(s) +
                          double(c.num_hidden_layers) * (8.0 * HIDI + 2.0 * c.num_attention_heads * c.qk_head_dim()) * s);
}

TEST(Programme, DemoPhasesDifferFromTheBaseOnlyWhereAllowed) {
  const Programme pr = load_programme(HMLA_SOURCE_DIR "/configs/demo.yaml");
  const std::map<std::string, std::set<std::string>> allowed{
      {"pretrain", {"name", "mode", "steps"}},
      {"equivalence", {"name", "mode", "steps"}},
      {"warmup", {"name", "mode", "steps", "warmup_steps"}},
      {"sparse", {"name", "mode", "lr", "indexer_lr", "warmup_steps"}}};
  ASSERT_EQ(pr.phases.size(), allowed.size());
  for (size_t i = 0; i < pr.phases.size(); ++i) {
    const std::string& name = pr.phases[i].name;
    ASSERT_TRUE(allowed.count(name)) << "unexpected phase " << name;
    std::set<std::string> differs;
    for (const auto& [k, v] : pr.phase_raw[i]) {
      auto it = pr.base_raw.find(k);
      if (it == pr.base_raw.end() || it->second != v) differs.insert(k);
    }
    for (const std::string& k : differs)
      EXPECT_TRUE(allowed.at(name).count(k)) << "phase " << name << " differs from the base in '" << k << "'";
    for (const std::string& k : allowed.at(name))
      EXPECT_TRUE(differs.count(k)) << "phase " << name << ": allowlisted key '" << k << "' no longer differs";
  }
  EXPECT_EQ(pr.phases[1].steps, 0);  // the equivalence phase only checks
  EXPECT_GE(pr.phases[0].seq_len, 4 * 32);  // 4 x index_topk of configs/demo_model.json
}

TEST(Programme, BadProgrammesAreClearErrors) {
  const std::string ok = "model: m.json\ndata: d\nphases:\n  - {name: a, mode: mha, steps: 1}\n";
  EXPECT_NO_THROW(parse_programme(ok, "p.yaml"));
  EXPECT_THROW(parse_programme(ok + "bogus: 1\n", "p.yaml"), ConfigError);
  EXPECT_THROW(parse_programme("model: m.json\ndata: d\nphases:\n  - {name: a, mode: mha, stepz: 1}\n", "p.yaml"),
               ConfigError);
  EXPECT_THROW(parse_programme("model: m.json\ndata: d\nphases:\n  - {name: a, mode: dense, steps: 1}\n", "p.yaml"),
               ConfigError);
  EXPECT_THROW(parse_programme("model: m.json\ndata: d\nbase: {batch: 6, micro_batches: 4}\nphases:\n  - {name: a, steps: 1}\n",
                               "p.yaml"),
               ConfigError);
  EXPECT_THROW(parse_programme("model: m.json\ndata: d\nbase: {batch: 5, micro_batches: 2}\nphases:\n  - {name: a, steps: 1}\n",
                               "p.yaml"),
               ConfigError);  // a remainder of one
  EXPECT_THROW(parse_programme("model: m.json\ndata: d\nbase: {seq_len: 1}\nphases:\n  - {name: a, steps: 1}\n", "p.yaml"),
               ConfigError);  // one position: no token has a next one to predict
  EXPECT_NO_THROW(parse_programme("model: m.json\ndata: d\nbase: {seq_len: 2}\nphases:\n  - {name: a, steps: 1}\n", "p.yaml"));
  EXPECT_NO_THROW(parse_programme("model: m.json\ndata: d\nbase: {batch: 6, micro_batches: 3}\nphases:\n  - {name: a, steps: 1}\n",
                                  "p.yaml"));
  EXPECT_THROW(parse_programme("model: m.json\nphases:\n  - {name: a, steps: 1}\n", "p.yaml"), ConfigError);
  EXPECT_THROW(parse_programme("model: m.json\ndata: d\nphases: []\n", "p.yaml"), ConfigError);
  const Programme pr = parse_programme("model: m.json\ndata: d\nphases:\n  - {name: a, steps: 1}\n", "/x/p.yaml");
  EXPECT_EQ(pr.model_config, "/x/m.json");  // relative to the programme file
}

std::string error_of(const std::string& yaml) {
  try {
    parse_programme(yaml, "p.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

// yaml-cpp keeps both entries of a duplicated key; last-wins would silently drop the first.
TEST(Programme, ADuplicatedKeyIsAnErrorAtEveryLevel) {
  const std::string head = "model: m.json\ndata: d\n";
  EXPECT_EQ(error_of(head + "seed: 1\nseed: 2\nphases:\n  - {name: a}\n"),
            "p.yaml: key 'seed' appears twice (lines 3 and 4); give it once");
  EXPECT_EQ(error_of(head + "base: {lr: 0.1, lr: 0.2}\nphases:\n  - {name: a}\n"),
            "p.yaml: base: key 'lr' appears twice (line 3); give it once");
  EXPECT_EQ(error_of(head + "phases:\n  - name: a\n    steps: 1\n    steps: 2\n"),
            "p.yaml: phases[0]: key 'steps' appears twice (lines 5 and 6); give it once");
}

TEST(Programme, BadTypesNameTheKeyTheLineAndTheFile) {
  const std::string head = "model: m.json\ndata: d\n";
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, steps: [1]}\n"),
            "p.yaml: phases[0]: steps (line 4) must be an integer, got '[1]'");
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, recompute_attention: maybe}\n"),
            "p.yaml: phases[0]: recompute_attention (line 4) must be true or false, got 'maybe'");
  EXPECT_EQ(error_of(head + "seed: -1\nphases:\n  - {name: a}\n"),
            "p.yaml: seed (line 3) must be a non-negative integer, got '-1'");
  EXPECT_EQ(error_of(head + "? [a, b]\n: 1\nphases:\n  - {name: a}\n"),
            "p.yaml (line 3): a key must be a plain name, got '[a, b]'");
  EXPECT_NE(error_of(head + "phases: [\n").find("p.yaml: not valid YAML: line"), std::string::npos);
}

// YAML types: a quoted "2" or a `!!str 2` is a string (as YAML says), never read as the number 2;
// YAML's own number tags are numbers.
TEST(Programme, AStringWhereANumberIsRequiredIsAnError) {
  const std::string head = "model: m.json\ndata: d\n";
  const std::string why = " (a string: write it without quotes or a tag)";
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, steps: \"2\"}\n"),
            "p.yaml: phases[0]: steps (line 4) must be an integer, got '\"2\"'" + why);
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, steps: '2'}\n"),
            "p.yaml: phases[0]: steps (line 4) must be an integer, got '\"2\"'" + why);
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, steps: !!str 2}\n"),
            "p.yaml: phases[0]: steps (line 4) must be an integer, got '!!str 2'" + why);
  EXPECT_EQ(error_of(head + "base: {lr: \"0.1\"}\nphases:\n  - {name: a}\n"),
            "p.yaml: base: lr (line 3) must be a number, got '\"0.1\"'" + why);
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, recompute_attention: \"true\"}\n"),
            "p.yaml: phases[0]: recompute_attention (line 4) must be true or false, got '\"true\"'" + why);
  EXPECT_EQ(error_of(head + "seed: \"3\"\nphases:\n  - {name: a}\n"),
            "p.yaml: seed (line 3) must be a non-negative integer, got '\"3\"'" + why);
  EXPECT_EQ(error_of(head + "hybrid_layers: [0, \"1\"]\nphases:\n  - {name: a}\n"),
            "p.yaml: hybrid_layers (line 3) must be a list of integers, got '[0, \"1\"]'");
  const Programme pr = parse_programme(head + "phases:\n  - {name: \"7\", steps: !!int 2, lr: !!float 1}\n", "p.yaml");
  EXPECT_EQ(pr.phases[0].name, "7");  // a string key takes any scalar
  EXPECT_EQ(pr.phases[0].steps, 2);
  EXPECT_EQ(pr.phases[0].optim.lr, 1.0);
}

TEST(Programme, HybridLayersNameEachLayerOnce) {
  const std::string head = "model: m.json\ndata: d\n", tail = "phases:\n  - {name: a}\n";
  EXPECT_EQ(error_of(head + "hybrid_layers: []\n" + tail),
            "p.yaml: hybrid_layers (line 3) is an empty list; name at least one layer, or write 'all' (the default) "
            "for every layer");
  EXPECT_EQ(error_of(head + "hybrid_layers: [0, 2, 0]\n" + tail),
            "p.yaml: hybrid_layers (line 3): layer 0 is listed twice; give each layer once");
  EXPECT_EQ(error_of(head + "hybrid_layers: [-1]\n" + tail), "p.yaml: hybrid_layers (line 3): layer -1 is negative");
  EXPECT_EQ(parse_programme(head + "hybrid_layers: [1, 0]\n" + tail, "p.yaml").hybrid_layers, (std::vector<int64_t>{1, 0}));
  EXPECT_TRUE(parse_programme(head + "hybrid_layers: all\n" + tail, "p.yaml").hybrid_layers.empty());
}

// attention_backend picks the dense attention's implementation on CUDA (hmla/ops/attention.h).
TEST(Programme, TheAttentionBackendKey) {
  const std::string head = "model: m.json\ndata: d\n", tail = "phases:\n  - {name: a}\n";
  EXPECT_EQ(parse_programme(head + tail, "p.yaml").attention_backend, AttnBackend::auto_);
  EXPECT_EQ(parse_programme(head + "attention_backend: cudnn\n" + tail, "p.yaml").attention_backend, AttnBackend::cudnn);
  EXPECT_EQ(parse_programme(head + "attention_backend: hmla\n" + tail, "p.yaml").attention_backend, AttnBackend::hmla);
  EXPECT_EQ(error_of(head + "attention_backend: flash\n" + tail),
            "p.yaml: attention_backend (line 3): attention backend 'flash' (known: auto, cudnn, hmla)");
}

TEST(Programme, OneDocumentOfBoundedNestingAndSize) {
  const std::string ok = "model: m.json\ndata: d\nphases:\n  - {name: a}\n";
  EXPECT_EQ(error_of(ok + "---\nphases: []\n"),
            "p.yaml: line 5: a second YAML document (after '---'); hmla reads one document per file");
  EXPECT_EQ(error_of("---\n" + ok + "...\n"), "(accepted)");  // one document, explicitly marked
  // 100,000 nested lists (yaml-cpp's parser recurses per level).
  EXPECT_EQ(error_of(ok + "x: " + std::string(100000, '[') + std::string(100000, ']') + "\n"),
            "p.yaml: line 5: nests deeper than 64 levels; hmla reads YAML of at most 64 levels");
  std::string block = ok + "x:\n";  // block mappings nest by indentation
  for (int i = 1; i <= 70; ++i) block += std::string(size_t(2 * i), ' ') + "k:\n";
  EXPECT_NE(error_of(block).find("nests deeper than 64 levels"), std::string::npos);
  // The root mapping is level 1: a value 63 levels deep is the deepest accepted.
  EXPECT_NE(error_of(ok + "x: " + std::string(63, '[') + std::string(63, ']') + "\n").find("unknown key 'x'"),
            std::string::npos);
  EXPECT_NE(error_of(ok + "x: " + std::string(64, '[') + std::string(64, ']') + "\n").find("nests deeper"),
            std::string::npos);
  const std::string pad = "#" + std::string(kMaxYamlBytes - ok.size() - 2, ' ') + "\n";
  EXPECT_EQ(error_of(ok + pad), "(accepted)");  // exactly kMaxYamlBytes
  EXPECT_EQ(error_of(ok + pad + "\n"), "p.yaml: 1048577 bytes of YAML, more than the 1.0 MiB hmla reads");
}

// Every error is one line, whatever the value it quotes.
TEST(Programme, ErrorsQuotingABlockValueStayOneLine) {
  const std::string head = "model: m.json\ndata: d\n";
  EXPECT_EQ(error_of(head + "phases:\n  - name: a\n    steps:\n      a: 1\n      b: 2\n"),
            "p.yaml: phases[0]: steps (line 6) must be an integer, got '{a: 1, b: 2}'");
  EXPECT_EQ(error_of(head + "phases:\n  - name: a\n    steps: |\n      1\n      2\n"),
            "p.yaml: phases[0]: steps (line 5) must be an integer, got '\"1\\n2\\n\"' (a string: write it without "
            "quotes or a tag)");
  EXPECT_EQ(error_of(head + "phases:\n  - name: a\n    steps: [" + std::string(200, '1') + "]\n"),
            "p.yaml: phases[0]: steps (line 5) must be an integer, got '[" + std::string(79, '1') + "...'");
  for (const std::string& bad : {head + "phases:\n  - name: a\n    steps: {a: 1,\n", head + "phases: [\n",
                                 head + "phases:\n  - name: a\n   - b\n"}) {
    const std::string e = error_of(bad);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
  }
}

// mqa_split_kv_b_proj is a phase key for the latent modes only (DESIGN.md section 1).
TEST(Programme, SplitKvBProjOnlyInLatentPhases) {
  const std::string head = "model: m.json\ndata: d\n";
  for (const char* mode : {"mqa_full_causal", "dsa_sparse"})
    EXPECT_EQ(error_of(head + "phases:\n  - {name: a, mode: " + mode + ", mqa_split_kv_b_proj: true}\n"), "(accepted)");
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, mode: dsa_warmup, mqa_split_kv_b_proj: true}\n"),
            "p.yaml: phases[0] (a): mqa_split_kv_b_proj needs a latent mode (mqa_full_causal or dsa_sparse); this "
            "phase runs dsa_warmup");
  // From the base it reaches every phase, so an mha phase there is refused too.
  EXPECT_EQ(error_of(head + "base: {mqa_split_kv_b_proj: true}\nphases:\n  - {name: a, mode: dsa_sparse}\n"
                            "  - {name: b, mode: mha}\n"),
            "p.yaml: phases[1] (b): mqa_split_kv_b_proj needs a latent mode (mqa_full_causal or dsa_sparse); this "
            "phase runs mha");
}

TEST(Programme, TheMoeBalancingKeysPerPhase) {
  const std::string head = "model: m.json\ndata: d\n";
  const Programme d = parse_programme(head + "phases:\n  - {name: a}\n", "p.yaml");
  EXPECT_EQ(d.phases[0].moe_bias_update_rate, 1e-3);  // DeepSeek-V3's defaults: on
  EXPECT_EQ(d.phases[0].moe_aux_loss_coeff, 1e-4);
  const Programme p = parse_programme(head + "base: {moe_bias_update_rate: 0.01}\nphases:\n  - {name: a}\n"
                                             "  - {name: b, moe_bias_update_rate: 0, moe_aux_loss_coeff: 0}\n",
                                      "p.yaml");
  EXPECT_EQ(p.phases[0].moe_bias_update_rate, 0.01);
  EXPECT_EQ(p.phases[1].moe_bias_update_rate, 0.0);  // 0 turns each off
  EXPECT_EQ(p.phases[1].moe_aux_loss_coeff, 0.0);
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, moe_bias_update_rate: -0.001}\n"),
            "p.yaml: phases[0] (a): moe_bias_update_rate = -0.001: it must be finite and >= 0");
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, moe_aux_loss_coeff: .nan}\n"),
            "p.yaml: phases[0] (a): moe_aux_loss_coeff = nan: it must be finite and >= 0");
  EXPECT_EQ(error_of(head + "base: {moe_aux_loss_coeff: .inf}\nphases:\n  - {name: a}\n"),
            "p.yaml: phases[0] (a): moe_aux_loss_coeff = inf: it must be finite and >= 0");
}

// Multi-token prediction's lambda (docs/deepseek_v4_math.md section 14): per phase or from the
// base, 0 by default (the MTP layers kept as stored), finite and >= 0. Whether the model has MTP
// layers to train is the run's check (load_run_inputs; tests/python/cli_errors.py).
TEST(Programme, TheMtpLossCoefficientPerPhase) {
  const std::string head = "model: m.json\ndata: d\n";
  EXPECT_EQ(parse_programme(head + "phases:\n  - {name: a}\n", "p.yaml").phases[0].mtp_loss_coeff, 0.0);
  const Programme p = parse_programme(head + "base: {mtp_loss_coeff: 0.3}\nphases:\n  - {name: a}\n"
                                             "  - {name: b, mtp_loss_coeff: 0}\n",
                                      "p.yaml");
  EXPECT_EQ(p.phases[0].mtp_loss_coeff, 0.3);
  EXPECT_EQ(p.phases[1].mtp_loss_coeff, 0.0);
  EXPECT_EQ(error_of(head + "phases:\n  - {name: a, mtp_loss_coeff: -0.1}\n"),
            "p.yaml: phases[0] (a): mtp_loss_coeff = -0.1: it must be finite and >= 0");
}

}  // namespace
}  // namespace hmla
