// `hmla forward` (logits of a checkpoint), `hmla backward` (a training step's loss and gradients,
// no update), `hmla init` (a freshly drawn checkpoint), `hmla convert` (a checkpoint rewritten as hmla
// writes its own) and `hmla generate` (continuations), all on a checkpoint directory: config.json (as transformers or hmla writes it) + model.safetensors (single
// or sharded; f32 or bf16). Each layer runs the mode its config records. generate runs the prompt
// once and then one token a step against a KV cache (CPU; DeepSeek-V4: v4_decode.cpp's).
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>

#include "commands.h"
#include "hmla/io/paths.h"
#include "hmla/core/index_values.h"
#include "hmla/data/batch.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/decode.h"
#include "hmla/model/losses.h"
#include "hmla/model/model.h"
#include "hmla/model/sample.h"
#include "hmla/text/tokenizer.h"
#include "inputs.h"
#include "stdout.h"
#include "validators.h"

namespace hmla::app {

namespace {

// The indexers counted in a memory plan made before the weights are read: a checkpoint's are known
// only once it is read, so they are left out (the plan stays a lower bound).
std::vector<bool> planned_indexers(const ModelConfig& c) { return std::vector<bool>(size_t(c.num_hidden_layers), false); }

// `c` is dir/config.json, read first so that inputs can be checked against it before the weights.
Model load_checkpoint_model(const std::string& dir, const ModelConfig& c) {
  MemoryPlan plan;  // before reading the weights: the parameters alone must fit
  plan_parameters(plan, c, planned_indexers(c), false, DType::f32);  // on the CPU
  plan.check(dir + "/config.json: the model");
  CheckpointTensors ck = read_checkpoint(dir, c);
  const io::TensorMap& w = ck.tensors;
  const std::vector<bool> has_indexer = checkpoint_indexers(c, w);
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    // A "shared" layer (IndexShare) never has an indexer of its own.
    HMLA_CHECK(has_indexer[L] || !c.runs_indexer(L), ConfigError, dir, ": layer ", L, " runs ",
               mode_name(c.layer_modes[L]),
               c.source.contains("hmla_layer_modes")
                   ? " (config.json's hmla_layer_modes)"
                   : " (config.json has no hmla_layer_modes, and with the index_* fields set every layer runs "
                     "dsa_sparse, as transformers does)",
               " but the checkpoint has no indexer tensors for it; set hmla_layer_modes in config.json (e.g. mha)");
  }
  Model m = build_model(c, has_indexer);
  load_checkpoint_into_model(m, std::move(ck), dir);
  return m;
}

// The prompt and the tokens asked for must fit the model's positions (RoPE and YaRN are defined up
// to max_position_embeddings), checked before any compute; returns how many positions that is.
int64_t check_generation_length(int64_t prompt, int64_t tokens, const ModelConfig& c, const std::string& config) {
  const int64_t max_pos = c.max_position_embeddings;
  HMLA_CHECK(prompt <= max_pos && tokens <= max_pos - prompt, ConfigError, "--prompt is ", prompt,
             " tokens and --tokens is ", tokens, ": ", prompt, " + ", tokens,
             " positions exceed max_position_embeddings = ", max_pos, " (", config, "); ",
             prompt < max_pos ? "pass --tokens " + std::to_string(max_pos - prompt) + " or less, or a shorter prompt"
                              : "shorten the prompt to at most " + std::to_string(max_pos - 1) + " tokens");
  return prompt + tokens;
}

// The tokenizer of a command's text: --tokenizer when given, else the checkpoint directory's
// tokenizer.json, else the byte tokenizer. A tokenizer.json is named on stderr (stdout carries the
// command's output); the byte tokenizer, what these commands always read, goes unsaid so that an
// error stays the one line on stderr. Its ids must fit the model's vocabulary, checked before any
// compute.
std::unique_ptr<text::Tokenizer> command_tokenizer(const std::string& option, const std::string& checkpoint,
                                                   const ModelConfig& c, const std::string& command) {
  std::unique_ptr<text::Tokenizer> tok =
      option.empty() ? text::checkpoint_tokenizer(checkpoint) : text::load_tokenizer(option);
  const bool bytes = tok->fingerprint() == text::byte_tokenizer()->fingerprint();
  HMLA_CHECK(!option.empty() || !bytes || tok->vocab_size() <= c.vocab_size, ConfigError, command, ": ", checkpoint,
             " has no tokenizer.json, and the byte tokenizer used without one (", tok->describe(), ") needs ",
             tok->vocab_size(), " ids, but config.json's vocab_size is ", c.vocab_size,
             ": bytes cannot be this model's tokens; pass --tokenizer with the model's own tokenizer.json");
  HMLA_CHECK(tok->vocab_size() <= c.vocab_size, ConfigError, command, ": the tokenizer (", tok->describe(),
             ") has ", tok->vocab_size(), " ids but ", checkpoint, "/config.json's vocab_size is ", c.vocab_size,
             "; pass --tokenizer with the model's own tokenizer");
  if (!bytes)
    std::cerr << command << ": tokenizer " << tok->describe() << "\n";
  return tok;
}

Batch one_document_rows(const Tensor& ids32) {
  const int64_t b = ids32.size(0), s = ids32.size(1);
  return {ids32, layout_causal(b, s)};
}

}  // namespace

void add_model_commands(CLI::App& app) {
  struct FwdOpts {
    std::string checkpoint, inputs, out, text, tokenizer;
    double moe_aux_loss_coeff = 0;  // backward: the MoE balance loss's alpha (0: none)
  };
  auto f = std::make_shared<FwdOpts>();
  CLI::App* fwd = app.add_subcommand(
      "forward", "Logits of a checkpoint: reads input_ids [b, s] (i32 or i64; one document per row) from\n"
                 "INPUTS (or tokenizes --text: one row, written back as input_ids) and writes logits\n"
                 "[b, s, vocab] (f32) to OUT, and per MoE layer L experts.<L> [b * s, num_experts_per_tok]\n"
                 "(i32, the chosen experts by descending choice value); DeepSeek-V4: per CSA layer L topk.<L> [b, s,\n"
                 "index_topk] (i32, the indexer's selection, -1 pads), and per hybrid_mla layer in a dsa mode\n"
                 "topk.<L> [b, s, hybrid_mla_index_topk + sliding_window] (its selection, then its window).");
  fwd->add_option("--checkpoint", f->checkpoint, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  CLI::Option* inputs =
      fwd->add_option("--inputs", f->inputs, "safetensors with input_ids")->check(CLI::ExistingFile);
  CLI::Option* text = fwd->add_option("--text", f->text, "text to tokenize instead of --inputs (one row)")
                          ->check(NonEmpty())
                          ->excludes(inputs);
  fwd->add_option("--tokenizer", f->tokenizer,
                  "--text's tokenizer: a tokenizer.json or its directory (default: the checkpoint's "
                  "tokenizer.json, else bytes)")
      ->needs(text);
  inputs->excludes(text);
  fwd->add_option("--out", f->out, "safetensors to write")->required()->check(NonEmpty());
  fwd->callback([f] {
    HMLA_CHECK(!f->inputs.empty() || !f->text.empty(), ConfigError, "forward: give --inputs or --text");
    io::check_output_file(f->out, "--out");  // before the work, not only when writing
    const ModelConfig cfg = load_model_config(f->checkpoint + "/config.json");  // DeepSeek-V4 too (CPU)
    Tensor ids;
    io::Metadata meta;  // --text: the tokenizer that made input_ids
    if (!f->text.empty()) {
      const std::unique_ptr<text::Tokenizer> tok = command_tokenizer(f->tokenizer, f->checkpoint, cfg, "forward");
      const std::vector<int32_t> v = tok->encode(f->text, true);  // as a training document begins
      meta["tokenizer"] = tok->describe();
      HMLA_CHECK(!v.empty() && int64_t(v.size()) <= cfg.max_position_embeddings, ConfigError, "forward: --text is ",
                 v.size(), " tokens; the model takes 1 to max_position_embeddings = ", cfg.max_position_embeddings);
      ids = Tensor::from_vector<int32_t>({1, int64_t(v.size())}, v);
    } else {
      io::TensorMap in = io::load_safetensors(f->inputs);
      check_inputs(in, {{"input_ids", {"b", "s"}, {DType::i32, DType::i64}}}, f->inputs);
      ids = token_ids(in.at("input_ids"), cfg.vocab_size, f->inputs + ": input_ids");
    }
    const Model m = load_checkpoint_model(f->checkpoint, cfg);
    std::vector<Tensor> experts, topk;
    io::TensorMap out{{"logits", model_logits(m, one_document_rows(ids), cfg.is_v4() ? &topk : nullptr, Comm::self(),
                                              &experts)}};
    if (!f->text.empty()) out["input_ids"] = ids;
    for (size_t L = 0; L < topk.size(); ++L)  // DeepSeek-V4's CSA layers: the indexer's selection
      if (topk[L].defined()) out["topk." + std::to_string(L)] = topk[L];
    for (int64_t L = 0; L < cfg.num_hidden_layers; ++L)
      if (experts[L].defined()) out["experts." + std::to_string(L)] = experts[L];
    io::save_safetensors(f->out, out, meta);
  });

  auto b = std::make_shared<FwdOpts>();
  CLI::App* bwd = app.add_subcommand(
      "backward",
      "A training step's forward and backward on a checkpoint, without the update: reads input_ids\n"
      "[b, s] (one document per row) from INPUTS and writes to OUT lm_loss [1] and indexer_kl [1]\n"
      "(the step's losses, DESIGN.md section 7), grad.<name> [f32] for every parameter (the gradient\n"
      "of lm_loss + indexer_loss_coeff * indexer_kl; the MoE gates' correction bias has none) and,\n"
      "per MoE layer L, experts.<L> [b * s, num_experts_per_tok] (i32, the chosen experts). With\n"
      "--moe-aux-loss-coeff alpha > 0 the step adds the MoE sequence-wise balance loss (docs/moe.md; its\n"
      "gradient is in grad.*) and writes moe_aux_loss [number of MoE layers] (f32, alpha included).");
  bwd->add_option("--checkpoint", b->checkpoint, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  bwd->add_option("--inputs", b->inputs, "safetensors with input_ids")->required()->check(CLI::ExistingFile);
  bwd->add_option("--out", b->out, "safetensors to write")->required()->check(NonEmpty());
  bwd->add_option("--moe-aux-loss-coeff", b->moe_aux_loss_coeff,
                  "alpha of the MoE sequence-wise balance loss (default 0: none)");
  bwd->callback([b] {
    HMLA_CHECK(std::isfinite(b->moe_aux_loss_coeff) && b->moe_aux_loss_coeff >= 0, ConfigError,
               "--moe-aux-loss-coeff = ", b->moe_aux_loss_coeff, ": it must be finite and >= 0");
    io::check_output_file(b->out, "--out");
    const ModelConfig cfg = load_model_config(b->checkpoint + "/config.json");  // DeepSeek-V4 too (CPU)
    io::TensorMap in = io::load_safetensors(b->inputs);
    check_inputs(in, {{"input_ids", {"b", "s"}, {DType::i32, DType::i64}}}, b->inputs);
    const Batch batch = one_document_rows(token_ids(in.at("input_ids"), cfg.vocab_size, b->inputs + ": input_ids"));
    const Model m = load_checkpoint_model(b->checkpoint, cfg);
    Tensor garena = Tensor::zeros({table_numel(m.table)}, DType::f32, m.device());
    io::TensorMap grads = arena_views(m.table, garena);
    StepOptions so;
    const int64_t n_moe = int64_t(moe_layers(cfg).size());
    if (b->moe_aux_loss_coeff > 0 && n_moe > 0) {  // one micro-batch: its sequences are the step's
      so.moe_aux_coeff = b->moe_aux_loss_coeff;
      so.aux_sequences = loss_sequence_count(batch.layout, &batch.input_ids, cfg.pad_token_id);
      so.aux_loss = Tensor::zeros({n_moe}, DType::f64, m.device());
    }
    const StepStats st = model_step(m, batch, so, grads);  // checks the step's memory first
    io::TensorMap out{{"lm_loss", Tensor::from_vector<float>({1}, {float(st.lm_loss)})},
                      {"indexer_kl", Tensor::from_vector<float>({1}, {float(st.indexer_kl)})}};
    if (so.aux_loss.defined()) {
      std::vector<float> aux;
      for (double v : so.aux_loss.to_vector<double>()) aux.push_back(float(v));
      out["moe_aux_loss"] = Tensor::from_vector<float>({n_moe}, aux);
    }
    for (const ParamSpec& p : m.table)
      if (!is_router_bias(p.name)) out["grad." + p.name] = grads.at(p.name);
    std::vector<Tensor> experts;
    model_logits(m, batch, nullptr, Comm::self(), &experts);
    for (int64_t L = 0; L < cfg.num_hidden_layers; ++L)
      if (experts[L].defined()) out["experts." + std::to_string(L)] = experts[L];
    io::save_safetensors(b->out, out);
  });

  struct InitOpts {
    std::string config, out;
    uint64_t seed = 0;
    int64_t shard_bytes = 0;
  };
  auto in = std::make_shared<InitOpts>();
  CLI::App* init = app.add_subcommand(
      "init", "A freshly initialised checkpoint (init_model's draw from --seed) of a model config: writes\n"
              "OUT/config.json and OUT/model.safetensors (or, with --shard-bytes, transformers' shards and\n"
              "model.safetensors.index.json), as training checkpoints are written.");
  init->add_option("--config", in->config, "model config.json (MLA models or deepseek_v4)")
      ->required()
      ->check(CLI::ExistingFile);
  init->add_option("--out", in->out, "checkpoint directory to write (created)")->required()->check(NonEmpty());
  init->add_option("--seed", in->seed, "initialisation seed")->capture_default_str()->check(Int(0));
  init->add_option("--shard-bytes", in->shard_bytes, "shard the weights at this many bytes a file (0: one file)")
      ->capture_default_str()
      ->check(Int(0));
  init->callback([in] {
    const ModelConfig cfg = load_model_config(in->config);
    std::vector<bool> has_indexer(size_t(cfg.num_hidden_layers));  // the layers whose mode runs one
    for (int64_t L = 0; L < cfg.num_hidden_layers; ++L)  // V4: transformers' form, every layer with DSA machinery
      has_indexer[size_t(L)] = cfg.is_v4() ? cfg.has_dsa(L) : cfg.runs_indexer(L);
    Model m = build_model(cfg, has_indexer);
    init_model(m, in->seed);
    std::filesystem::create_directories(in->out);
    save_model_config(in->out + "/config.json", cfg);
    save_model_weights(in->out, m, in->shard_bytes);
  });

  struct ConvertOpts {
    std::string checkpoint, out;
    int64_t shard_bytes = 0;
  };
  auto cv = std::make_shared<ConvertOpts>();
  CLI::App* conv = app.add_subcommand(
      "convert", "A checkpoint as hmla writes its own: reads CHECKPOINT (single or sharded; FP8 / FP4 weights\n"
                 "dequantized, DeepSeek-V4's released names taken as transformers saves them) and writes\n"
                 "OUT/config.json and f32 weights (the integer tables as I64, the multi-token-prediction\n"
                 "tensors unchanged), what `hmla init` and training checkpoints write.");
  conv->add_option("--checkpoint", cv->checkpoint, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  conv->add_option("--out", cv->out, "checkpoint directory to write (created)")->required()->check(NonEmpty());
  conv->add_option("--shard-bytes", cv->shard_bytes, "shard the weights at this many bytes a file (0: one file)")
      ->capture_default_str()
      ->check(Int(0));
  conv->callback([cv] {
    const ModelConfig cfg = load_model_config(cv->checkpoint + "/config.json");
    const Model m = load_checkpoint_model(cv->checkpoint, cfg);
    std::filesystem::create_directories(cv->out);
    save_model_config(cv->out + "/config.json", cfg);
    save_model_weights(cv->out, m, cv->shard_bytes);
  });

  struct GenOpts {
    std::string checkpoint, prompt, tokenizer;
    int64_t tokens = 200;
    double temperature = 0.0;
    uint64_t seed = 0;
  };
  auto g = std::make_shared<GenOpts>();
  CLI::App* gen = app.add_subcommand("generate", "Continue a prompt with a checkpoint (its tokenizer.json, else bytes).");
  gen->add_option("--checkpoint", g->checkpoint, "checkpoint directory")->required()->check(CLI::ExistingDirectory);
  gen->add_option("--prompt", g->prompt, "text to continue")->required()->check(NonEmpty());
  gen->add_option("--tokenizer", g->tokenizer,
                  "a tokenizer.json or its directory (default: the checkpoint's tokenizer.json, else bytes)");
  gen->add_option("--tokens", g->tokens, "new tokens at most")->capture_default_str()->check(Int(1));
  gen->add_option("--temperature", g->temperature, "0: greedy; > 0: sampling")->capture_default_str()->check(Real(0, false));
  gen->add_option("--seed", g->seed, "sampling seed")->capture_default_str()->check(Int(0));
  gen->callback([g] {
    const std::string config = g->checkpoint + "/config.json";
    const ModelConfig cfg = load_model_config(config);
    const std::unique_ptr<text::Tokenizer> tok = command_tokenizer(g->tokenizer, g->checkpoint, cfg, "generate");
    const std::vector<int32_t> ids = tok->encode(g->prompt, true);
    HMLA_CHECK(!ids.empty(), ConfigError, "generate: --prompt encodes to no tokens");
    const int64_t positions = check_generation_length(int64_t(ids.size()), g->tokens, cfg, config);
    MemoryPlan plan;  // the prefill and the cache, before the weights are read
    plan_parameters(plan, cfg, planned_indexers(cfg), false, DType::f32);  // on the CPU
    plan_decode(plan, cfg, {"prompt + --tokens", positions});
    plan.check("generate: " + config + "'s model over " + std::to_string(positions) + " positions");
    const Model m = load_checkpoint_model(g->checkpoint, cfg);
    std::mt19937_64 rng(g->seed);
    std::cout << g->prompt;
    flush_stdout();
    // The prompt once (prefill), then one token a step against the KV cache (hmla/model/decode.h).
    KvCache cache = kv_cache(m, positions);
    Tensor logits = decode_step(m, cache, ids);
    // A BPE token may end inside a UTF-8 character, so the text is the decode of all new ids, printed
    // up to where it is whole: a decode ending in U+FFFD (an unfinished character) waits for more.
    std::vector<int32_t> generated;
    size_t printed = 0;
    auto print = [&](bool last) {
      const std::string all = tok->decode(generated, true);
      if (!last && all.ends_with("\xEF\xBF\xBD")) return;
      std::cout << all.substr(std::min(printed, all.size()));
      printed = all.size();
      flush_stdout();  // streamed: a failed write stops the generation
    };
    for (int64_t k = 0; k < g->tokens; ++k) {
      const int32_t next = sample_token({logits.data<float>(), size_t(m.cfg.vocab_size)}, g->temperature, rng);
      if (tok->is_stop(next)) break;
      generated.push_back(next);
      print(false);
      if (k + 1 < g->tokens) logits = decode_step(m, cache, std::span<const int32_t>(&next, 1));
    }
    print(true);
    std::cout << "\n";
  });
}

}  // namespace hmla::app
