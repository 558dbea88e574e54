// The activation table is the forward's allocation, to the byte (STYLE.md: one table of (name,
// shape, dtype) per lifetime class, the only place the order of saved tensors is written): for
// every mode, with and without recomputing the attention core, for both layer kinds (a dense MLP,
// DeepSeekMoE), on each device of the build (the CPU in test_model; the emulated CUDA device in
// test_train_emu, label emu; a GPU in test_train_cuda), the memory plan counts the table, the arena
// holds exactly its bytes, every tensor the attention saves is the arena's view, and after the
// forward nothing else it keeps is live.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hmla/core/cuda.h"
#include "hmla/model/decoder_layer.h"
#include "hmla/model/model.h"
#include "hmla/ops/backend.h"
#include "testing.h"
#include "tiny_config.h"

namespace hmla {
namespace {

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu};
  if (cuda_backend() && cuda_device_count() > 0) d.push_back(Device::cuda);
  return d;
}

// A tiny model whose widths the CUDA kernels take (multiples of 16: tests/cuda/emu/emu_model.json's);
// moe: its second layer's MLP is DeepSeekMoE (the other layer kind).
ModelConfig cuda_sized(const char* mode, bool moe) {
  testing::TinyConfig t;
  t.modes = {mode, mode};
  t.hidden = 64, t.heads = 4, t.q_lora = 32, t.kv_lora = 16, t.nope = 16, t.rope = 16, t.v = 16;
  t.indexer = testing::TinyIndexer{16, 32, 8};
  if (!moe) return testing::tiny_config(t);
  nlohmann::json j = testing::tiny_config_json(t);
  j["mlp_layer_types"] = {"dense", "sparse"};
  j["n_routed_experts"] = 4, j["n_group"] = 2, j["topk_group"] = 1, j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 16, j["n_shared_experts"] = 1;
  return parse_model_config(j, "tiny moe");
}

bool in_arena(const Tensor& t, const ArenaCursor& cur) {
  for (const auto& [dt, buffer] : cur.flat)
    if (t.defined() && t.shares_storage(buffer.first)) return true;
  return false;
}

int64_t table_bytes(const std::vector<ActSpec>& t) {
  int64_t n = 0;
  for (const ActSpec& a : t) n += shape_numel(a.shape) * int64_t(dtype_size(a.dtype));
  return n;
}

// The model's forward over its layers (model.cpp's order), the residual stream from random
// values; returns the live bytes it leaves beyond `live0`.
int64_t forward_keeps(const Model& m, const ActRows& rows, const DocLayout& layout, size_t live0, bool& all_in_arena) {
  const ModelConfig& c = m.cfg;
  const Device dev = m.device();
  const DType compute = compute_dtype(dev);
  const int64_t b = rows.b, s = rows.s, hid = c.hidden_size;
  const std::vector<ActSpec> table = activation_table(c, rows, compute);
  std::vector<LayerSaved> layers(size_t(c.num_hidden_layers));
  {
    ArenaCursor cur(table, dev);
    Tensor h = cur.next({b * s, hid}).view({b, s, hid});
    h.copy_from(Tensor::from_vector<float>({b, s, hid}, testing::randn(size_t(b * s * hid), 3)).to(dev));
    for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
      LayerSaved& sv = layers[size_t(L)];
      sv.attn.rope = m.rope(s, 0);
      take_layer_views(cur, c, L, rows, compute, sv);
      decoder_layer_forward(decoder_layer(m, L, nullptr), h, layout, sv, Comm::self(), rows.recompute);
      for (const MlaField& f : mla_fields(c, L, b, s, rows.S, compute, rows.recompute))
        if (!in_arena(f.slot(sv.attn), cur)) {
          ADD_FAILURE() << "layer " << L << ": the attention's " << f.name << " is not the arena's view";
          all_in_arena = false;
        }
      h = sv.out;
    }
    cur.next({b * s, hid}), cur.next({b * s});
    cur.finish();
    if (dev == Device::cuda) allocator(dev).synchronize();
    return int64_t(allocator(dev).live_bytes()) - int64_t(live0);
  }
}

// One case: a device, a mode, recomputation or not, and the second layer's MLP.
void expect_plan_is_allocation(Device dev, const char* mode, bool recompute, bool moe) {
  SCOPED_TRACE(std::string(device_name(dev)) + ", " + mode + (recompute ? ", recompute" : "") + (moe ? ", moe" : ""));
  const ModelConfig c = cuda_sized(mode, moe);
  const bool dsa = is_dsa(c.layer_modes[0]);
  Model m = build_model(c, {dsa, dsa}, dev);
  const int64_t b = 2, s = 12;
  const DType compute = compute_dtype(dev);
  const ActRows rows{b, s, s, recompute};
  const std::vector<ActSpec> table = activation_table(c, rows, compute);
  MemoryPlan plan;
  plan_activation_table(plan, c, {"b", b}, {"s", s}, compute, recompute);
  EXPECT_EQ(plan.total(), table_bytes(table)) << "the plan counts the table";
  const DocLayout layout = layout_from_cu_seqlens(s, {{0, 5, s}, {0, s}});
  layout.doc_start_on(dev), layout.doc_end_on(dev), m.rope(s, 0);  // their caches, before counting
  bool all_in_arena = true;
  forward_keeps(m, rows, layout, allocator(dev).live_bytes(), all_in_arena);  // warms any lazy workspace
  const size_t live0 = allocator(dev).live_bytes();
  EXPECT_EQ(forward_keeps(m, rows, layout, live0, all_in_arena), table_bytes(table))
      << "what the forward keeps beyond its arena";
  EXPECT_TRUE(all_in_arena);
}

TEST(ActivationArena, ThePlanIsTheAllocationToTheByte) {
  for (Device dev : devices())
    for (const char* mode : {"mha", "mqa_full_causal", "dsa_warmup", "dsa_sparse"})
      for (bool recompute : {false, true})
        for (bool moe : {false, true}) expect_plan_is_allocation(dev, mode, recompute, moe);
}

// The table's attention rows by mode: the MHA form keeps per-head keys and values, the latent
// form the absorbed queries and o; dsa layers their indexer's state and table; the core's output
// and statistics only without recomputation.
TEST(ActivationArena, TheAttentionsRowsFollowTheMode) {
  auto names = [](const char* mode, bool recompute) {
    testing::TinyConfig t;
    t.modes = {mode};
    std::vector<std::string> n;
    for (const MlaField& f : mla_fields(testing::tiny_config(t), 0, 2, 3, 3, DType::f32, recompute)) n.push_back(f.name);
    return n;
  };
  using V = std::vector<std::string>;
  const V head{"q", "qa", "rstd_q", "cq", "kva", "rstd_kv", "ka"};
  const V ind{"indexer.qI", "indexer.kpre", "indexer.k_mean", "indexer.k_rstd", "indexer.kI", "indexer.w", "topk"};
  auto cat = [](V a, const V& b) { return a.insert(a.end(), b.begin(), b.end()), a; };
  EXPECT_EQ(names("mha", false), cat(head, {"v", "k", "core.out", "core.lse"}));
  EXPECT_EQ(names("mha", true), cat(head, {"v", "k"}));
  EXPECT_EQ(names("mqa_full_causal", false), cat(head, {"qabs", "core.out", "core.lse", "o"}));
  EXPECT_EQ(names("dsa_warmup", false), cat(cat(head, ind), {"v", "k", "core.out", "core.lse"}));
  EXPECT_EQ(names("dsa_sparse", false), cat(cat(head, ind), {"qabs", "core.out", "core.lse", "core.lse_c", "o"}));
  EXPECT_EQ(names("dsa_sparse", true), cat(cat(head, ind), {"qabs", "o"}));
}

}  // namespace
}  // namespace hmla
