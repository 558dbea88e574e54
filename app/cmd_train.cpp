// `hmla train` (the four-phase programme) and `hmla prepare-data` (token files).
#include <cstdlib>
#include <iostream>
#include <optional>

#include "commands.h"
#include "hmla/data/prepare.h"
#include "hmla/dist/cp.h"
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
    bool memory_plan = false;
    std::vector<int64_t> plan_seq_lens;
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
  train->add_flag("--shard-optimizer", o->t.shard_optimizer,
                  "ZeRO-1: each rank keeps the optimizer state of its share of whole tensors (balanced by\n"
                  "size); gradients reduce-scattered to their owners, updated weights all-gathered\n"
                  "(docs/scale_out.md). Checkpoints then hold one optimizer file per rank and resume\n"
                  "on any rank count, sharded or not");
  train->add_option("--ep", o->t.ep, "expert-parallel ranks: E data-parallel replicas split each MoE layer's routed\n"
                                     "experts, rows travelling by all-to-all (E divides DP and the experts;\n"
                                     "CPU; docs/scale_out.md)")->capture_default_str()->check(Int(1, 1 << 20));
  train->add_option("--device", o->t.device, "cpu or cuda (default: the programme's device key, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  train->add_option("--cp-split", o->t.cp_split, "how sequences are split (only contiguous)")
      ->capture_default_str()
      ->check(NonEmpty());
  train->add_flag("--memory-plan", o->memory_plan, "print each phase's memory plan (parameters, gradients, moments,\n"
                  "activations by kind) and whether it fits the budget, then exit: no data read, nothing\n"
                  "allocated; --device cuda needs no device (HMLA_MEMORY_BUDGET: the budget)");
  train->add_option("--plan-seq-len", o->plan_seq_lens, "with --memory-plan: a plan per sequence length (every\n"
                    "phase's seq_len replaced), e.g. 4096,16384,65536")
      ->delimiter(',')
      ->check(CLI::Range(int64_t(2), int64_t(1) << 40));
  train->callback([o] {
    check_cp_split(o->t.cp_split);
    HMLA_CHECK(o->plan_seq_lens.empty() || o->memory_plan, ConfigError, "--plan-seq-len needs --memory-plan");
    if (o->memory_plan) {
      std::cout << programme_memory_plan(load_programme(o->programme), o->t, o->plan_seq_lens);
      return;
    }
    inject_test_failure(o->t);
    run_programme(load_programme(o->programme), o->t, std::cout);
  });

  struct PrepOpts {
    PrepareOptions o;
    std::string tokenizer;
    std::optional<std::string> eos;
    bool quiet = false;
  };
  auto p = std::make_shared<PrepOpts>();
  CLI::App* prep = app.add_subcommand(
      "prepare-data",
      "Tokenize text, JSON Lines (*.jsonl, *.jsonl.zst), zstd-compressed text (*.zst) or convert a\n"
      "Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx) into OUT/train.safetensors and\n"
      "OUT/heldout.safetensors (tokens + document offsets); docs/data.md. The byte tokenizer\n"
      "(pad 0, bos 1, eos 2, byte b -> b + 3) by default.");
  prep->add_option("inputs", p->o.inputs, "text or jsonl files, directories (recursive, sorted), globs (sorted),\n"
                                          "or one Megatron PREFIX")->required();
  prep->add_option("--out", p->o.out_dir, "output directory")->required()->check(NonEmpty());
  prep->add_option("--separator", p->o.separator,
                   "text files: a line equal to this ends a document (empty: a blank line)")
      ->capture_default_str();
  prep->add_option("--heldout-every", p->o.heldout_every, "every N-th document is held out")
      ->capture_default_str()
      ->check(Int(2));
  prep->add_option("--tokenizer", p->tokenizer, "a Hugging Face tokenizer.json or a directory holding one\n"
                                                "(default: the byte tokenizer)")->check(NonEmpty());
  prep->add_option("--eos-token", p->eos, "with --tokenizer: the token every document ends with");
  prep->add_option("--text-key", p->o.text_key, "jsonl: the member holding a line's text")
      ->capture_default_str()->check(NonEmpty());
  prep->add_flag("--strict", p->o.strict, "jsonl: a line without the text (invalid JSON, no key, not a string)\n"
                                          "is an error (default: skipped and counted in the summary)");
  prep->add_option("--threads", p->o.threads, "tokenizer threads")->capture_default_str()->check(Int(1, 1024));
  prep->add_option("--vocab-size", p->o.vocab_size, "Megatron input: the vocab_size recorded (default: the\n"
                                                    "largest id + 1); ids must lie below it")->check(Int(1));
  prep->add_flag("--quiet", p->quiet, "no progress line");
  prep->callback([p] {
    HMLA_CHECK(!p->eos || !p->tokenizer.empty(), ConfigError, "prepare-data: --eos-token needs --tokenizer");
    std::unique_ptr<text::Tokenizer> tok;
    if (!p->tokenizer.empty()) tok = text::load_tokenizer(p->tokenizer, p->eos);
    p->o.tokenizer = tok.get();
    p->o.log = &std::cout;
    p->o.progress = !p->quiet;
    prepare_data(p->o);
  });
}

}  // namespace hmla::app
