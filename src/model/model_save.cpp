// A model's weights into a checkpoint directory (model.h, save_model_weights): the parameters in
// the table's names, the integer tables as I64, the kept MTP tensors as read; one file or
// transformers' shards + index. Everything is checked before the first byte is written.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "hmla/io/safetensors.h"
#include "hmla/model/model.h"
#include "hmla/model/params.h"

namespace hmla {

namespace fs = std::filesystem;

namespace {

// tid2eid as transformers keeps it (a long buffer), from the model's i32 table, checked.
Tensor int_table_i64(const Model& m, const std::string& name, const Tensor& t) {
  const std::vector<int32_t> v = expert_table(t, t.shape(), m.cfg.moe.n_routed_experts, "saving the model", name);
  Tensor out = Tensor::empty(t.shape(), DType::i64);
  for (size_t i = 0; i < v.size(); ++i) out.data<int64_t>()[i] = v[i];
  return out;
}

}  // namespace

io::TensorMap host_params(const Model& m) {
  const Tensor arena = m.arena.on(Device::cpu);
  io::TensorMap out = arena_views(m.table, arena);
  if (!m.ep) return out;
  // Each rank's experts are its arena's tail, one equal block per rank (expert_shard_table): they
  // go to the group's rank 0, which views rank q's block by rank q's table.
  Comm& ep = *m.ep;
  const int R = ep.size();
  const int64_t rep = table_numel(std::vector<ParamSpec>(m.table.begin(), m.table.begin() + ptrdiff_t(m.first_expert)));
  const int64_t block = arena.numel() - rep;
  const bool gathers = ep.rank() == 0;
  const Tensor all = Tensor::empty({gathers ? block * R : 0}, DType::f32);
  std::vector<int64_t> send(size_t(R), 0), recv(size_t(R), gathers ? block * int64_t(sizeof(float)) : 0);
  send[0] = block * int64_t(sizeof(float));
  ep.alltoallv(arena.data<float>() + rep, send, all.data<float>(), recv, Device::cpu);
  if (!gathers) return out;
  const std::vector<ParamSpec> full = full_param_table(m);
  for (int q = 0; q < R; ++q) {
    const std::vector<ParamSpec> t = expert_shard_table(full, m.cfg.moe.n_routed_experts, R, q);
    const std::vector<ParamSpec> experts(t.begin() + ptrdiff_t(m.first_expert), t.end());
    for (auto& [name, v] : arena_views(experts, all.slice(0, q * block, (q + 1) * block))) out[name] = v;
  }
  return out;
}

void save_model_weights(const std::string& dir, const Model& m, const io::TensorMap& host_params,
                        int64_t max_shard_bytes) {
  io::TensorMap tensors = host_params;
  for (const auto& [name, t] : tensors) check_finite_weight(t, "saving the model", name);
  for (const auto& [name, t] : m.ints) {
    HMLA_CHECK(!tensors.count(name) && !m.kept.count(name), IoError, "saving the model: tensor '", name,
               "' is given twice");
    tensors[name] = int_table_i64(m, name, t);
  }
  for (const auto& [name, t] : m.kept)
    HMLA_CHECK(!tensors.count(name), IoError, "saving the model: kept tensor '", name, "' is also a parameter");
  const io::Metadata meta{{"format", "pt"}};
  const fs::path d(dir), single = d / "model.safetensors", index = d / "model.safetensors.index.json";
  if (max_shard_bytes <= 0) {
    io::save_safetensors(single.string(), tensors, meta, m.kept);
    fs::remove(index);  // a stale index would be read instead of the new file
    return;
  }
  // Shards in name order (transformers' order is the module's; any order reads the same).
  std::map<std::string, int64_t> sizes;
  for (const auto& [name, t] : tensors) sizes[name] = t.nbytes();
  for (const auto& [name, t] : m.kept) sizes[name] = int64_t(t.bytes.size());
  std::vector<std::vector<std::string>> shards(1);
  int64_t filled = 0, total = 0;
  for (const auto& [name, n] : sizes) {
    if (filled > 0 && filled + n > max_shard_bytes) shards.emplace_back(), filled = 0;
    shards.back().push_back(name);
    filled += n;
    total += n;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  const size_t count = shards.size();
  for (size_t i = 0; i < count; ++i) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", i + 1, count);
    io::TensorMap part;
    io::StoredMap kept;
    for (const std::string& name : shards[i]) {
      if (auto it = tensors.find(name); it != tensors.end()) part[name] = it->second;
      else kept[name] = m.kept.at(name);
      weight_map[name] = file;
    }
    io::save_safetensors((d / file).string(), part, meta, kept);
  }
  const nlohmann::json j = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  io::write_file_atomic(index.string(), j.dump(2) + "\n");
  fs::remove(single);  // the index wins anyway; the old single file would only mislead
}

void save_model_weights(const std::string& dir, const Model& m, int64_t max_shard_bytes) {
  save_model_weights(dir, m, host_params(m), max_shard_bytes);
}

}  // namespace hmla
