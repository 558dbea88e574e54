// `hmla bench ep` (ep_bench.h): the exchange of ep.h with balanced routing, measured on the wire.
#include "ep_bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <nlohmann/json.hpp>

#include "hmla/core/error.h"
#include "hmla/dist/comm.h"
#include "hmla/dist/ep.h"
#include "hmla/dist/ep_traffic.h"
#include "hmla/model/config.h"

namespace hmla::bench {

namespace {

// The rank's expert rows per expert under the balanced routing: slot i = t k + j of T k goes to
// expert (i + rank) mod E (a token's k choices distinct while k <= E).
std::vector<int64_t> balanced_rows(int64_t slots, int64_t E, int rank) {
  std::vector<int64_t> n(size_t(E), slots / E);
  for (int64_t i = 0; i < slots % E; ++i) ++n[size_t((i + rank) % E)];
  return n;
}

}  // namespace

void run_ep_bench(const EpBenchOptions& opt, std::ostream& os) {
  const ModelConfig c = load_model_config(opt.config);
  HMLA_CHECK(c.has_moe_layers(), ConfigError, "bench ep: ", opt.config, " has no MoE layers");
  HMLA_CHECK(opt.dtype == "bf16" || opt.dtype == "f32", ConfigError, "bench ep: --dtype ", opt.dtype,
             ": use bf16 or f32");
  Comm& ep = Comm::world();
  const int64_t E = c.moe.n_routed_experts, k = c.moe.num_experts_per_tok, D = c.hidden_size, R = ep.size();
  HMLA_CHECK(E % R == 0, ConfigError, "bench ep: the job's ", R, " ranks (the EP group) must divide n_routed_experts = ", E);
  const int64_t tokens = checked_product({{"micro_batch", opt.micro_batch}, {"seq_len", opt.seq_len}}, "bench ep tokens");
  const int64_t slots = checked_product({{"tokens", tokens}, {"k", k}}, "bench ep slots");
  const DType dt = opt.dtype == "bf16" ? DType::bf16 : DType::f32;
  const int64_t elem = int64_t(dtype_size(dt));
  Tensor rows = Tensor::zeros({slots, D}, dt);  // the values do not change what moves
  const std::vector<int64_t> counts = balanced_rows(slots, E, ep.rank());
  std::vector<double> ms;
  int64_t wire = 0, count_bytes = 0;
  for (int rep = -1; rep < opt.reps; ++rep) {  // one warm-up
    ep.barrier();
    const int64_t b0 = ep.bytes_sent();
    const auto t0 = std::chrono::steady_clock::now();
    const EpPlan p = ep_plan(ep, counts);
    const int64_t b1 = ep.bytes_sent();
    const Tensor at_experts = ep_dispatch(ep, p, rows);   // forward: the rows to their experts
    const Tensor back = ep_return(ep, p, at_experts);     // their outputs back
    const Tensor dy = ep_dispatch(ep, p, back);           // backward: the outputs' gradients out
    (void)ep_return(ep, p, dy);                           // the inputs' gradients back
    ep.barrier();
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 0) ms.push_back(t);
    wire = ep.bytes_sent() - b1, count_bytes = b1 - b0;
  }
  const int64_t plan = ep_all_to_all_bytes(tokens, k, D, elem, R);
  // Balanced routing sends exactly the plan's rows when ep divides the slots and E divides them
  // (every expert the same count); otherwise the plan's floor and the rounding differ by a row.
  const bool exact = slots % E == 0;
  double bad = exact && wire != plan ? 1 : 0;
  ep.allreduce_max(&bad, 1);
  HMLA_CHECK(bad == 0, Error, "bench ep: a rank sent ", wire, " bytes for a layer, the plan counts ", plan);
  std::sort(ms.begin(), ms.end());
  const double med = ms.empty() ? 0 : ms[ms.size() / 2];
  if (!ep.is_root()) return;
  nlohmann::json j{{"bench", "ep"},          {"config", opt.config},   {"ranks", R},
                   {"ep", R},                {"tokens", tokens},       {"k", k},
                   {"hidden", D},            {"experts", E},           {"dtype", opt.dtype},
                   {"rows_leaving", ep_rows_leaving(tokens, k, R)},    {"wire_bytes_per_layer", wire},
                   {"plan_bytes_per_layer", plan},                     {"count_bytes_per_layer", count_bytes},
                   {"matches_plan", wire == plan},                     {"reps", opt.reps},
                   {"ms_per_layer", med},    {"GB/s", med > 0 ? double(wire) / (med * 1e6) : 0.0}};
  os << j.dump() << "\n";
}

}  // namespace hmla::bench
