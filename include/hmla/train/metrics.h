// metrics.jsonl (docs/programme.md): one JSON object a line, of three kinds, each with its
// "phase": a step row, an equivalence row (a latent phase's entry check) and a phase-end row.
// One row type with its writer and its reader, so that the trainer (which writes the file and,
// on --resume, reads it back) and `hmla report` (which draws it) read it by the same rules.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace hmla {

// A DeepSeek-V4 stack's attention mass (docs/v4_attention.md "Attention mass"): [kind][part], the
// mean over the step's loss rows, heads and the kind's layers of the softmax's probability on each
// part; NaN where not computed. Written as attn_mass_<part>_<kind>.
inline constexpr const char* kAttnMassKinds[3] = {"sliding", "csa", "hca"};  // V4Kind's order
inline constexpr const char* kAttnMassParts[3] = {"window", "entries", "sink"};
using AttnMass = std::array<std::array<double, 3>, 3>;
inline AttnMass no_attn_mass() {
  AttnMass m;
  for (auto& k : m) k.fill(NAN);
  return m;
}

struct MetricsRow {
  // The kind is what the row holds: a "step" (a step row), else "equivalence_max_diff" (an
  // equivalence row), else "heldout_lm_loss", a number or null (a phase-end row); else other.
  enum class Kind { step, equivalence, phase_end, other };
  MetricsRow() = default;
  MetricsRow(Kind k, std::string phase_name) : kind(k), phase(std::move(phase_name)) {}
  Kind kind = Kind::other;
  std::string phase;  // "?" when the line's phase is not a string

  // Numbers read back as NaN where the field is missing, null or not a number; NaN is written
  // as null (indexer_kl outside dsa phases, a held-out loss that could not be evaluated).
  static constexpr double none = NAN;
  // step
  int64_t step = 0;  // 1-based within its phase
  double lm_loss = none, indexer_kl = none, lr = none, grad_norm_backbone = none, grad_norm_indexer = none,
         tokens_per_s = none;
  double peak_bytes = none;  // a byte count, written as an integer
  // A DeepSeek-V4 stack's dsa step: the KL per layer kind (the means over its CSA layers and over
  // its hybrid_mla layers, without coeff), written only where the kind ran one.
  double indexer_kl_csa = none, indexer_kl_hybrid = none;
  // The multi-token-prediction loss (mean over depths of their CE means, without mtp_loss_coeff),
  // written only in phases that train it (docs/deepseek_v4_math.md section 14).
  double mtp_loss = none;
  // A DeepSeek-V4 stack's attention mass per kind, written on the steps that computed it (the
  // logging steps) for the kinds the stack has (a sliding layer's entries: none).
  AttnMass attn_mass = no_attn_mass();
  // A CUDA step's host cost (cuda_counters over the step), written only on that device.
  double cuda_syncs = none, cuda_launches = none, h2d_bytes = none, d2h_bytes = none, cuda_uploads = none;
  double ep_bytes = none;  // expert parallelism: the bytes rank 0 sent its EP group in the step
  // A MoE model's step (docs/moe.md "Load balancing"), one entry per MoE layer (moe_layers, in
  // order): the load imbalance max_e load / mean load over the step's global counts, and the
  // sequence-wise balance loss with its coefficient (written only where the loss ran).
  std::vector<int64_t> moe_layers;
  std::vector<double> moe_imbalance, moe_aux_loss;
  // equivalence: max|logits_mqa - logits_mha| and max|logits_mha|
  double equivalence_max_diff = none, equivalence_max_logit = none;
  // phase end: the held-out loss (or why there is none), the means of the first and last 20 steps
  double heldout_lm_loss = none, first20_lm_loss = none, last20_lm_loss = none, first20_indexer_kl = none,
         last20_indexer_kl = none, seconds = none;
  std::string heldout_unavailable;  // written only when not empty
};

// The row as one line of metrics.jsonl (without the newline), its keys in a fixed order per kind.
std::string metrics_line(const MetricsRow& row);

struct MetricsFile {
  std::vector<MetricsRow> rows;  // in file order; blank lines hold none
  int64_t malformed = 0;         // lines that are not a JSON object with a "phase" (a line cut by a crash)
  int64_t first_malformed = 0;   // the first of them (1-based line number), 0 if none
};

// Reads metrics.jsonl (an absent file has no rows). Malformed lines are counted, not fatal: the
// report draws what is left; the trainer's resume refuses them (require_well_formed).
MetricsFile read_metrics(const std::filesystem::path& path);
// IoError naming the first malformed line of `file` (read from `path`), if there is one.
void require_well_formed(const MetricsFile& file, const std::filesystem::path& path);

// The metrics.jsonl a run writes: rank 0 alone (the other ranks' rows go nowhere). A resumed run
// appends to the file as its checkpoint left it.
class MetricsLog {
 public:
  MetricsLog(bool root, const std::filesystem::path& path, bool append);
  void row(const MetricsRow& r);
  int64_t bytes();  // the file's length so far, for the checkpoint's state (0 off rank 0)
  void close() { file_.close(); }

 private:
  bool root_;
  std::ofstream file_;
};

// On --resume: metrics.jsonl must be at least as long as the checkpoint recorded (bytes < 0: a
// checkpoint from before hmla recorded it; left as it is); truncate_metrics then cuts it back to
// that length, so a resumed run's file equals an uninterrupted one's.
void check_metrics_length(const std::filesystem::path& path, int64_t bytes);
void truncate_metrics(const std::filesystem::path& path, int64_t bytes);

}  // namespace hmla
