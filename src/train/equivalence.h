// The MHA/MQA equivalence policy (DESIGN.md section 7): when a phase enters a latent mode with
// some hybrid layer, the model's logits with the hybrid layers in MHA and in latent MQA form must
// agree to a tolerance relative to their largest, or the programme stops.
#pragma once
#include <ostream>
#include <vector>

#include "hmla/dist/comm.h"
#include "hmla/train/metrics.h"
#include "hmla/train/programme.h"

namespace hmla::train {

// Logs the check (console and metrics) and throws ConfigError when it fails. `cp`: the
// context-parallel group over whose rows the maxima are taken.
void check_phase_equivalence(const PhaseSettings& ph, const Model& model, const std::vector<bool>& hybrid,
                             const Batch& eval, Comm& cp, std::ostream& log, MetricsLog& metrics);

}  // namespace hmla::train
