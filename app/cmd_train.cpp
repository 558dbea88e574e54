// `hmla train` (the four-phase programme) and `hmla prepare-data` (byte-level token files).
#include <cstdlib>
#include <iostream>

#include "commands.h"
#include "hmla/dist/cp.h"
#include "hmla/train/data.h"
#include "hmla/train/trainer.h"
#include "validators.h"

namespace hmla::app {

namespace {

// HMLA_TEST_FAIL_RANK=R makes rank R fail once its rank grid stands (tests/python/mpi_dp.py: one
// rank's failure ends the whole job). Read here, in the CLI, so that the trainer holds no test
// branch: it only calls TrainOptions::on_rank_ready.
void inject_test_failure(TrainOptions& t) {
  const char* f = std::getenv("HMLA_TEST_FAIL_RANK");
  if (!f) return;
  const int failing = std::atoi(f);
  t.on_rank_ready = [failing](int rank) {
    if (rank == failing) throw Error("injected failure on rank " + std::to_string(rank) + " (HMLA_TEST_FAIL_RANK)");
  };
}

}  // namespace

void add_train_commands(CLI::App& app) {
  struct TrainOpts {
    std::string programme;
    TrainOptions t;
  };
  auto o = std::make_shared<TrainOpts>();
  CLI::App* train = app.add_subcommand(
      "train",
      "Run a programme: phases of mha / mqa_full_causal / dsa_warmup / dsa_sparse training over a\n"
      "shared base (docs/programme.md). Writes RUN_DIR/metrics.jsonl, RUN_DIR/checkpoints/*,\n"
      "RUN_DIR/summary.json and the final config.json + model.safetensors.");
  train->add_option("programme", o->programme, "programme YAML")->required()->check(CLI::ExistingFile);
  train->add_option("--out", o->t.out_dir, "run directory")->capture_default_str()->check(NonEmpty());
  train->add_flag("--resume", o->t.resume, "continue from RUN_DIR/checkpoints/latest (the programme and data\n"
                                           "must be those the run started with)");
  train->add_flag("--allow-safe-changes", o->t.allow_safe_changes,
                  "with --resume: accept changed steps, log_every, checkpoint_every and eval_rows\n"
                  "of the current and later phases");
  train->add_option("--cp", o->t.cp, "context-parallel ranks per replica (under mpirun -np CP * DP): each\n"
                                     "group of CP consecutive ranks splits every sequence by rows; the\n"
                                     "DP groups are data parallel")->capture_default_str()->check(Int(1, 1 << 20));
  train->add_option("--device", o->t.device, "cpu or cuda (default: the programme's device key, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--cp-split", o->t.cp_split, "how sequences are split (only contiguous)")
      ->capture_default_str()
      ->check(NonEmpty());
  train->callback([o] {
    check_cp_split(o->t.cp_split);
    inject_test_failure(o->t);
    run_programme(load_programme(o->programme), o->t, std::cout);
  });

  struct PrepOpts {
    std::vector<std::string> files;
    std::string out, separator = "%";
    int64_t heldout_every = 20;
  };
  auto p = std::make_shared<PrepOpts>();
  CLI::App* prep = app.add_subcommand(
      "prepare-data",
      "Tokenize text files byte by byte (pad 0, bos 1, eos 2, byte b -> b + 3) into\n"
      "OUT/train.safetensors and OUT/heldout.safetensors (tokens + document offsets).");
  prep->add_option("files", p->files, "text files")->required()->check(CLI::ExistingFile);
  prep->add_option("--out", p->out, "output directory")->required()->check(NonEmpty());
  prep->add_option("--separator", p->separator, "a line equal to this ends a document (empty: a blank line)")
      ->capture_default_str();
  prep->add_option("--heldout-every", p->heldout_every, "every N-th document is held out")
      ->capture_default_str()
      ->check(Int(2));
  prep->callback([p] { prepare_data(p->files, p->out, p->separator, p->heldout_every); });
}

}  // namespace hmla::app
