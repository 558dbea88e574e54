// The rank grid of a run and rank 0's hold on the run directory (rank_grid.h).
#include "rank_grid.h"

#include "hmla/core/error.h"

namespace hmla::train {

RankGrid set_up_rank_grid(const Programme& pr, int cp_ranks, int ep_ranks) {
  Comm& comm = Comm::world();
  HMLA_CHECK(cp_ranks >= 1 && comm.size() % cp_ranks == 0, ConfigError, "--cp ", cp_ranks, " does not divide the ",
             comm.size(), " ranks");
  const int dp = comm.size() / cp_ranks, dp_rank = comm.rank() / cp_ranks, cp_rank = comm.rank() % cp_ranks;
  HMLA_CHECK(ep_ranks >= 1 && dp % ep_ranks == 0, ConfigError, "--ep ", ep_ranks, " does not divide the ", dp,
             " data-parallel replicas (", comm.size(), " ranks / --cp ", cp_ranks, ")");
  // EP groups: replicas [g E, (g + 1) E) at the same CP rank, ordered by replica.
  RankGrid grid{comm, comm.split(dp_rank, cp_rank), dp, dp_rank,
                comm.split((dp_rank / ep_ranks) * cp_ranks + cp_rank, dp_rank % ep_ranks),
                comm.split(dp_rank % ep_ranks, comm.rank())};
  for (const PhaseSettings& ph : pr.phases) {
    HMLA_CHECK(ph.micro_batches % dp == 0, ConfigError, pr.path, ": phase '", ph.name, "' has micro_batches = ",
               ph.micro_batches, ", which the ", dp, " data-parallel ranks must divide");
    HMLA_CHECK(ph.seq_len % cp_ranks == 0, ConfigError, "--cp ", cp_ranks, " must divide phase '", ph.name,
               "''s seq_len ", ph.seq_len);
  }
  return grid;
}

RunDir claim_on_root(const Programme& pr, const TrainOptions& opt, Comm& comm) {
  RunDir d;
  if (comm.is_root()) d = RunDir::claim(pr, opt.out_dir, opt.resume);
  comm.barrier();
  return d;
}

void begin_on_root(RunDir& d, Comm& comm, Device dev, const text::TokenizerRecord& tokenizer) {
  if (comm.is_root()) d.begin(dev, tokenizer);
  comm.barrier();
}

}  // namespace hmla::train
