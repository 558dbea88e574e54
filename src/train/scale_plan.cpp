// `hmla plan` (scale_plan.h): a rank's memory from plan_rank_parameters and plan_activations at
// seq_len / cp rows, its all-to-all bytes from ep_traffic.h, and the search over layouts.
#include "hmla/train/scale_plan.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "hmla/core/error.h"
#include "hmla/dist/ep_traffic.h"
#include "hmla/model/model.h"
#include "hmla/model/rank_plan.h"
#include "hmla/train/programme.h"
#include "run_inputs.h"

namespace hmla {

namespace {

DType plan_compute(Device dev) { return dev == Device::cpu ? DType::f32 : DType::bf16; }  // DESIGN.md section 7

std::string rows_word(int64_t n) { return std::to_string(n) + (n == 1 ? " row" : " rows"); }

// "141 GB (131.3 GiB)": what the user wrote, in both units.
std::string device_str(int64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.4g GB (%s)", double(bytes) / 1e9, format_bytes(double(bytes)).c_str());
  return buf;
}

void line(std::ostream& out, const std::string& what, double bytes) {
  out << "  " << what << std::string(what.size() < 58 ? 58 - what.size() : 1, ' ') << format_bytes(bytes) << "\n";
}

}  // namespace

std::vector<PlanCase> plan_cases(const std::string& config, const std::vector<int64_t>& seq_lens, int64_t rows) {
  std::vector<PlanCase> cases;
  const std::string ext = std::filesystem::path(config).extension().string();
  if (ext == ".yaml" || ext == ".yml") {
    const Programme pr = load_programme(config);
    const std::vector<train::PhaseModel> models = train::phase_models(pr);
    for (int64_t s : seq_lens.empty() ? std::vector<int64_t>{0} : seq_lens)
      for (size_t i = 0; i < pr.phases.size(); ++i) {
        const PhaseSettings& ph = pr.phases[i];
        cases.push_back({ph.name, mode_name(ph.mode), models[i].cfg, models[i].indexer, s > 0 ? s : ph.seq_len,
                         ph.batch / ph.micro_batches, ph.micro_batches, ph.recompute_attention});
      }
    return cases;
  }
  HMLA_CHECK(ext == ".json", ConfigError, config, ": use a programme (.yaml) or a model config (.json)");
  const ModelConfig c = load_model_config(config, LayerModesFrom::config);
  // The layers' own modes; the indexer tensors a DSA layer keeps (a V4 stack's CSA and hybrid_mla
  // layers always have theirs, as the checkpoint stores them).
  std::vector<bool> indexer;
  for (int64_t L = 0; L < c.num_hidden_layers; ++L)
    indexer.push_back(c.has_dsa(L) && (c.is_v4() || is_dsa(c.layer_modes[size_t(L)])));
  for (int64_t s : seq_lens.empty() ? std::vector<int64_t>{4096} : seq_lens)
    cases.push_back({std::filesystem::path(config).filename().string(), "", c, indexer, s, rows, 0, false});
  return cases;
}

void check_layout(const PlanCase& pc, const ScaleLayout& l) {
  HMLA_CHECK(l.ranks >= 1 && l.cp >= 1 && l.ep >= 1, ConfigError, "--ranks, --ep and --cp must be at least 1");
  HMLA_CHECK(l.ranks % l.cp == 0, ConfigError, "--cp ", l.cp, " does not divide --ranks ", l.ranks);
  HMLA_CHECK(pc.seq_len % l.cp == 0, ConfigError, "--cp ", l.cp, " does not divide seq_len ", pc.seq_len,
             ": each rank holds seq_len / cp rows");
  const int64_t dp = l.dp();
  HMLA_CHECK(dp % l.ep == 0, ConfigError, "--ep ", l.ep, " does not divide the ", dp, " data-parallel ranks (--ranks ",
             l.ranks, " / --cp ", l.cp, "): the EP group is carved out of them");
  const MoeConfig& m = pc.cfg.moe;
  HMLA_CHECK(l.ep == 1 || pc.cfg.has_moe_layers(), ConfigError, "--ep ", l.ep,
             ": the model has no MoE layers (use --ep 1)");
  HMLA_CHECK(l.ep == 1 || m.n_routed_experts % l.ep == 0, ConfigError, "--ep ", l.ep,
             " does not divide n_routed_experts = ", m.n_routed_experts,
             ": each EP rank holds a contiguous block of n_routed_experts / ep experts per MoE layer");
  HMLA_CHECK(pc.micro_batches == 0 || pc.micro_batches % dp == 0, ConfigError, "phase '", pc.name,
             "' has micro_batches = ", pc.micro_batches, ", which the ", dp, " data-parallel ranks must divide");
}

RankPlan plan_rank(const PlanCase& pc, const ScaleLayout& l, Device dev) {
  check_layout(pc, l);
  const DType compute = plan_compute(dev);
  const ModelConfig& c = pc.cfg;
  RankPlan r;
  plan_rank_parameters(r.state, c, pc.indexer, {l.ep, l.cp * l.dp(), l.shard_optimizer}, compute);
  const SizeFactor s = l.cp > 1 ? SizeFactor{"seq_len / cp", pc.seq_len / l.cp} : SizeFactor{"seq_len", pc.seq_len};
  plan_activations(r.activations, c, {"micro-batch rows", pc.rows}, s, true, compute, pc.recompute);
  plan_ep_buffers(r.activations, c, {"micro-batch rows", pc.rows}, s, l.ep, compute);
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) r.moe_layers += c.is_moe_layer(L);
  if (c.is_v4() && c.v4.mtp_params) r.moe_layers += c.form.num_nextn_predict_layers;  // MTP blocks: MoE too
  r.tokens = checked_product({{"rows", pc.rows}, s}, "a rank's tokens");
  r.rank_micro_batches = pc.micro_batches == 0 ? 1 : pc.micro_batches / l.dp();
  r.a2a_layer = ep_all_to_all_bytes(r.tokens, c.moe.num_experts_per_tok, c.hidden_size, int64_t(dtype_size(compute)), l.ep);
  r.a2a_step = checked_product({{"bytes", r.a2a_layer}, {"MoE layers", r.moe_layers}, {"micro-batches", r.rank_micro_batches}},
                               "the all-to-all bytes per step");
  return r;
}

std::string rank_plan_report(const std::vector<PlanCase>& cases, const ScaleLayout& l, Device dev,
                             int64_t device_bytes) {
  std::ostringstream out;
  const DType compute = plan_compute(dev);
  for (const PlanCase& pc : cases) {
    const RankPlan r = plan_rank(pc, l, dev);
    out << "plan [" << pc.name << "] (" << (pc.mode.empty() ? "" : pc.mode + ", ") << "seq_len " << pc.seq_len
        << ", micro-batch " << rows_word(pc.rows) << ", " << device_name(dev) << "): " << l.ranks << " ranks = cp "
        << l.cp << " x dp " << l.dp() << ", ep " << l.ep;
    if (l.ep > 1) out << " (" << pc.cfg.moe.n_routed_experts / l.ep << " routed experts per MoE layer per rank)";
    out << ", optimizer " << (l.shard_optimizer ? "sharded over cp x dp (ZeRO-1)" : "replicated") << "\n";
    out << "  per rank:\n";
    for (const MemoryPlan::Item& it : r.state.items()) line(out, it.what, double(it.bytes));
    out << "  activations of a micro-batch, " << rows_word(r.tokens / pc.rows) << " of each sequence (lower bounds):\n";
    for (const MemoryPlan::Item& it : r.activations.items()) line(out, "  " + it.what, double(it.bytes));
    line(out, "total (at least)", double(r.total()));
    const int64_t k = pc.cfg.moe.num_experts_per_tok;
    if (l.ep > 1)
      out << "  all-to-all sent per rank (balanced routing, " << dtype_name(compute) << "): 4 exchanges x "
          << ep_rows_leaving(r.tokens, k, l.ep) << " rows leaving (" << r.tokens << " tokens x k " << k << " x (ep - 1) / ep) x "
          << pc.cfg.hidden_size << " hidden = " << format_bytes(double(r.a2a_layer)) << " (" << r.a2a_layer
          << " B) per MoE layer per micro-batch; x " << r.moe_layers << " MoE layers x " << r.rank_micro_batches
          << (r.rank_micro_batches == 1 ? " micro-batch = " : " micro-batches = ") << format_bytes(double(r.a2a_step)) << " (" << r.a2a_step << " B) per step\n";
    else
      out << "  all-to-all: none (ep 1)\n";
    const int64_t total = r.total();
    out << "  device memory " << device_str(device_bytes) << ": "
        << (total <= device_bytes ? "fits, " + format_bytes(double(device_bytes - total)) + " to spare"
                                  : "does not fit, " + format_bytes(double(total - device_bytes)) + " over")
        << "\n";
  }
  return out.str();
}

namespace {

struct Candidate {
  ScaleLayout l;
  int64_t total = 0;  // the largest over the cases
  bool within(const Candidate& o) const {  // no larger in ep, cp and sharding
    return l.ep <= o.l.ep && l.cp <= o.l.cp && l.shard_optimizer <= o.l.shard_optimizer;
  }
};

std::string layout_str(const Candidate& c) {
  return "ep " + std::to_string(c.l.ep) + " cp " + std::to_string(c.l.cp) + (c.l.shard_optimizer ? " ZeRO-1" : "") +
         " (" + format_bytes(double(c.total)) + ")";
}

}  // namespace

std::string layout_search(const std::vector<PlanCase>& cases, Device dev, int64_t device_bytes) {
  std::vector<int64_t> lengths;
  for (const PlanCase& pc : cases)
    if (std::find(lengths.begin(), lengths.end(), pc.seq_len) == lengths.end()) lengths.push_back(pc.seq_len);
  std::ostringstream out;
  for (int64_t s : lengths) {
    std::vector<const PlanCase*> at;
    for (const PlanCase& pc : cases)
      if (pc.seq_len == s) at.push_back(&pc);
    out << "layouts that fit " << device_str(device_bytes) << " per rank: " << at.front()->name << ", seq_len " << s
        << ", micro-batch " << rows_word(at.front()->rows) << ", " << device_name(dev) << " (" << dtype_name(plan_compute(dev))
        << " compute):\n";
    out << "| ranks | smallest layouts that fit: ep, cp, ZeRO-1 (rank's total) |\n|---|---|\n";
    for (int64_t R = 8; R <= 1024; R *= 2) {
      std::vector<Candidate> all, fit;
      for (int64_t cp = 1; cp <= R; cp *= 2)
        for (int64_t ep = 1; ep <= R / cp; ep *= 2)
          for (bool shard : {false, true}) {
            Candidate c{{R, ep, cp, shard}};
            bool ok = true;
            for (const PlanCase* pc : at) {
              try {
                check_layout(*pc, c.l);
              } catch (const ConfigError&) {
                ok = false;  // a layout this case cannot run (cp past seq_len, ep past the experts)
                break;
              }
              c.total = std::max(c.total, plan_rank(*pc, c.l, dev).total());
            }
            if (!ok) continue;
            all.push_back(c);
            if (c.total <= device_bytes) fit.push_back(c);
          }
      std::vector<std::string> smallest;
      for (const Candidate& c : fit)
        if (std::none_of(fit.begin(), fit.end(),
                         [&](const Candidate& o) { return &o != &c && o.within(c) && !c.within(o); }))
          smallest.push_back(layout_str(c));
      out << "| " << R << " | ";
      if (!smallest.empty()) {
        for (size_t i = 0; i < smallest.size(); ++i) out << (i ? "; " : "") << smallest[i];
      } else if (!all.empty()) {
        const Candidate& least =
            *std::min_element(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) { return a.total < b.total; });
        out << "none; the least: " << layout_str(least);
      } else {
        out << "no layout runs the cases";
      }
      out << " |\n";
    }
  }
  return out.str();
}

int64_t parse_device_memory(const std::string& text) {
  const char* at = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(at, &end);
  std::string suffix(end);
  std::erase(suffix, ' ');
  for (char& ch : suffix) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> scale{
      {"", 1},      {"B", 1},          {"KB", 1e3},       {"MB", 1e6},       {"GB", 1e9},       {"TB", 1e12},
      {"KIB", 1024}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  const auto u = scale.find(suffix);
  const bool ok = end != at && errno == 0 && x > 0 && u != scale.end() && x * u->second >= 1 && x * u->second < 9.2e18;
  HMLA_CHECK(ok, ConfigError, "--device-memory '", text,
             "': use a positive byte count with an optional KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB "
             "suffix, e.g. 141GB");
  return static_cast<int64_t>(x * u->second);
}

}  // namespace hmla
