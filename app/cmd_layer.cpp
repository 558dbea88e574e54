// `hmla layer`: one MLA attention layer forward and backward on tensors from files, for
// checking hmla against another implementation (README: "Checking a layer").
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "hmla/core/index_values.h"
#include "hmla/dist/cp.h"
#include "hmla/io/paths.h"
#include "hmla/io/safetensors.h"
#include "hmla/model/indexer.h"
#include "hmla/model/mla_layer.h"
#include "inputs.h"
#include "layer_settings.h"
#include "validators.h"

namespace hmla::app {

namespace {

// What the command reads, by name (hidden is the config's hidden_size).
std::vector<InputSpec> layer_inputs() {
  using P = InputSpec::Presence;
  const std::vector<DType> index{DType::i32, DType::i64};
  return {{"hidden_states", {"b", "s", "hidden"}, {DType::f32}},
          {"grad_output", {"b", "s", "hidden"}, {DType::f32}},
          {"input_ids", {"b", "s"}, index, P::optional},
          {"cu_seqlens", {"documents + 1"}, index, P::optional}};
}

}  // namespace

void add_layer_command(CLI::App& app) {
  struct Opts {
    std::string config, mode, weights, inputs, out, settings, cp_split = "contiguous";
    int64_t layer = 0, cp = 1;
    bool train_indexer_only = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "layer",
      "One MLA attention layer, forward and backward (L = sum(output * grad_output)).\n"
      "W holds the layer's tensors without the 'model.layers.{L}.self_attn.' prefix; I holds\n"
      "hidden_states [b,s,hidden], grad_output [b,s,hidden], optionally input_ids [b,s] and\n"
      "cu_seqlens (b = 1). OUT gets output, grad.hidden_states and grad.<name> for every tensor of W;\n"
      "dsa modes add indexer_loss [1] and topk_indices [b,s,K+W] (L then includes the indexer loss).");
  cmd->add_option("--config", o->config, "HF config.json (DeepSeek-V3.2 fields + hmla keys)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--mode", o->mode, "override hmla_layer_modes: mha | mqa_full_causal | dsa_warmup | dsa_sparse")
      ->check(OneOf({"mha", "mqa_full_causal", "dsa_warmup", "dsa_sparse"}, "mode"));
  cmd->add_option("--layer", o->layer, "which layer of the config this is (its mode)")->capture_default_str()->check(Int(0));
  cmd->add_option("--settings", o->settings, "hmla settings YAML (e.g. mqa_split_kv_b_proj: true)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--weights", o->weights, "safetensors (or sharded index) with the layer's tensors")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--inputs", o->inputs, "safetensors with hidden_states, grad_output, ...")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", o->out, "safetensors to write")->required()->check(NonEmpty());
  cmd->add_flag("--train-indexer-only", o->train_indexer_only,
                "dsa modes: compute only the indexer's gradients; the backbone's backward is not run");
  cmd->add_option("--cp", o->cp,
                  "context-parallel ranks (run under mpirun -np CP): rank r computes rows [r*s/CP, (r+1)*s/CP);\n"
                  "rank 0 gathers and writes the same OUT as one rank, and prints each rank's bytes sent")
      ->capture_default_str()
      ->check(Int(1));
  cmd->add_option("--cp-split", o->cp_split, "how the rows are split (only contiguous)")->capture_default_str()->check(NonEmpty());
  cmd->callback([o] {
    check_cp_split(o->cp_split);
    if (Comm::world().is_root()) io::check_output_file(o->out, "--out");  // before the work; rank 0 writes
    ModelConfig cfg = load_model_config(o->config);
    check_mla_layers(cfg, o->config);
    if (!o->mode.empty()) set_all_modes(cfg, parse_mode(o->mode, "--mode"));
    HMLA_CHECK(o->layer >= 0 && o->layer < cfg.num_hidden_layers, ConfigError, "--layer ", o->layer,
               ": the config has ", cfg.num_hidden_layers, " layers");
    const LayerMode mode = cfg.layer_modes[o->layer];
    LayerSettings settings;
    if (!o->settings.empty()) settings = load_layer_settings(o->settings);
    settings.train_indexer_only |= o->train_indexer_only;
    HMLA_CHECK(!settings.train_indexer_only || is_dsa(mode), ConfigError,
               "--train-indexer-only needs a dsa mode; layer ", o->layer, " runs ", mode_name(mode));
    validate_layer_settings(cfg, settings, o->settings.empty() ? "settings" : o->settings);

    MlaLayer L;
    L.cfg = &cfg;
    L.layer = o->layer;
    const io::TensorMap weights = io::load_checkpoint_tensors(o->weights);
    check_mla_weights(weights, cfg, false, is_dsa(mode), o->weights);
    L.w = attn_tensors(weights);
    if (settings.mqa_split_kv_b_proj) {
      split_kv_b_proj(L.w, cfg);
      L.split_kv_b_proj = true;
    }

    io::TensorMap in = io::load_safetensors(o->inputs);
    const DimSizes dims = check_inputs(in, layer_inputs(), o->inputs, {{"hidden", cfg.hidden_size}});
    const Tensor& x = in.at("hidden_states");
    const int64_t b = dims.at("b"), s = dims.at("s");
    MemoryPlan plan;  // a rank under --cp keeps s / cp query rows
    mla_memory_plan(plan, cfg, mode, {"", 1}, {"b", b}, o->cp > 1 ? SizeFactor{"s / cp", s / o->cp} : SizeFactor{"s", s},
                    DType::f32);  // `hmla layer` runs on the CPU
    plan.check(o->config + ": layer " + std::to_string(o->layer) + " over hidden_states " + shape_str(x.shape()));
    const Tensor ids =
        in.count("input_ids") ? token_ids(in.at("input_ids"), cfg.vocab_size, o->inputs + ": input_ids") : Tensor();
    DocLayout layout = layout_causal(b, s);
    if (in.count("cu_seqlens")) {
      HMLA_CHECK(b == 1, IoError, o->inputs, ": cu_seqlens describes one row, but b = ", b);
      layout = layout_from_cu_seqlens(s, {index_values(in.at("cu_seqlens"), "cu_seqlens")});
    }

    // Context parallelism: the world is the group; every rank reads the whole inputs and keeps
    // its rows (the layout and the loss-row weights are built over all rows, in global positions).
    Comm& world = Comm::world();
    HMLA_CHECK(o->cp >= 1 && world.size() == o->cp, ConfigError, "--cp ", o->cp, " needs exactly ", o->cp,
               " ranks (mpirun -np ", o->cp, "); this job has ", world.size());
    Comm& cp = o->cp == 1 ? Comm::self() : world;
    const RowShard sh = row_shard(cp, s);
    const Tensor x_own = take_rows(x, sh);
    MlaSaved saved;
    Tensor y = mla_forward(L, x_own, layout, saved, cp);
    MlaBackwardOptions opt;
    opt.backbone = !settings.train_indexer_only;
    if (is_dsa(mode)) {
      const Tensor rw = loss_row_weights(layout, ids.defined() ? &ids : nullptr, cfg.pad_token_id);
      opt.row_weight = take_rows(rw.view({b, s, 1}), sh).view({b, sh.rows});
    }
    MlaGrads g = mla_backward(L, x_own, layout, saved, take_rows(in.at("grad_output"), sh), opt, cp);
    const int64_t sent = cp.bytes_sent();
    const CpTraffic want = mla_cp_traffic(cfg, mode, b, s, o->cp, opt.backbone);

    // Gather: per-row tensors by rows, weight gradients and the loss by sums over the group.
    if (L.split_kv_b_proj) fold_kv_b_proj(g.dweights, cfg);
    io::TensorMap out{{"output", cp_all_gather_rows(cp, y)}};
    if (g.dx.defined()) out["grad.hidden_states"] = cp_all_gather_rows(cp, g.dx);
    for (auto& [name, t] : attn_tensor_map(g.dweights)) {
      cp.allreduce_sum(t.data<float>(), t.numel());
      out["grad." + name] = t;
    }
    if (is_dsa(mode)) {
      double loss = g.indexer_loss;
      cp.allreduce_sum(&loss, 1);
      out["indexer_loss"] = Tensor::from_vector<float>({1}, {static_cast<float>(loss)});
      out["topk_indices"] = cp_all_gather_rows(cp, saved.topk);
    }
    if (o->cp > 1) {
      std::vector<double> bytes(o->cp, 0.0);
      bytes[cp.rank()] = double(sent);
      cp.allreduce_sum(bytes.data(), o->cp);
      if (cp.is_root())
        std::cout << nlohmann::json{{"cp", o->cp}, {"mode", mode_name(mode)}, {"b", b}, {"s", s},
                                    {"bytes_sent_per_rank", bytes}, {"model_bytes", want.forward + want.backward}}
                         .dump()
                  << std::endl;
    }
    if (cp.is_root()) io::save_safetensors(o->out, out);
  });
}

}  // namespace hmla::app
