// `hmla bench ...`: the benchmarks users read (side by side with their baselines, one run).
#include <algorithm>
#include <iostream>

#include "attention_bench.h"
#include "dsa_bench.h"
#include "indexer_bench.h"
#include "train_bench.h"
#include "tokenizer_bench.h"
#include <nlohmann/json.hpp>

#include "commands.h"
#include "validators.h"
#include "hmla/core/error.h"
#include "hmla/model/mla_layer.h"
#include "hmla/train/trainer.h"
#include "hmla/ops/cpu_blas.h"

namespace hmla::app {

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks, each side by side with its baseline");
  bench->require_subcommand(1);
  // After a bench that ran (an error stays the only stderr line); stdout keeps only the results.
  bench->final_callback([] {
    if (const std::string hint = cpu_blas_hint(); !hint.empty()) std::cerr << hint << "\n";
  });
  auto o = std::make_shared<bench::AttentionBenchOptions>();
  CLI::App* att = bench->add_subcommand(
      "attention",
      "Dense per-document causal attention, fwd and fwd+bwd, against the naive materialised\n"
      "arm and OpenBLAS sgemm 2048^3 at the same thread count (OMP_NUM_THREADS).");
  att->add_flag("--json", o->json, "one JSON object per line instead of a table");
  att->add_option("--s", o->seq_lens, "sequence lengths")->delimiter(',')->capture_default_str()->check(Int(1));
  att->add_option("--doc-len", o->doc_lens,
                  "document lengths of the packed layouts; 0 = one document per row")
      ->delimiter(',')->capture_default_str()->check(Int(0));
  att->add_option("--batch", o->batch, "rows per batch")->capture_default_str()->check(Int(1));
  att->add_option("--heads", o->heads, "query heads H")->capture_default_str()->check(Int(1));
  att->add_option("--kv-heads", o->kv_heads, "key/value heads (divides H)")->capture_default_str()->check(Int(1));
  att->add_option("--dqk", o->dqk, "query/key head width")->capture_default_str()->check(Int(1));
  att->add_option("--dv", o->dv, "value head width")->capture_default_str()->check(Int(1));
  att->add_option("--reps", o->reps, "timed repetitions (0: 5 up to s=2048, 3 at 4096, 2 above)")
      ->capture_default_str()->check(Int(0, 1000000));
  att->add_option("--naive-max-s", o->naive_max_s, "omit the naive arm above this s")->capture_default_str()->check(Int(0));
  att->callback([o] {
    for (int64_t s : o->seq_lens)
      HMLA_CHECK(s >= 1, ConfigError, "--s: sequence lengths must be positive, got ", s);
    for (int64_t d : o->doc_lens)
      HMLA_CHECK(d >= 0, ConfigError, "--doc-len: must be >= 0, got ", d);
    HMLA_CHECK(o->heads % o->kv_heads == 0, ConfigError, "--kv-heads ", o->kv_heads,
               " must divide --heads ", o->heads);
    bench::run_attention_bench(*o, std::cout);
  });

  auto io = std::make_shared<bench::IndexerBenchOptions>();
  CLI::App* ind = bench->add_subcommand(
      "indexer",
      "Lightning indexer on one causal document: scores + top-k, and the fused dense KL (time and\n"
      "workspace) against the materialised [s, s] arm.");
  ind->add_flag("--json", io->json, "one JSON object per line");
  ind->add_option("--s", io->seq_lens, "sequence lengths")->delimiter(',')->capture_default_str()->check(Int(1));
  ind->add_option("--heads", io->heads, "attention heads H (the KL target)")->capture_default_str()->check(Int(1));
  ind->add_option("--dqk", io->dqk, "attention q/k width")->capture_default_str()->check(Int(1));
  ind->add_option("--index-heads", io->index_heads, "HI")->capture_default_str()->check(Int(1));
  ind->add_option("--index-dim", io->index_dim, "DI")->capture_default_str()->check(Int(1));
  ind->add_option("--topk", io->topk, "K")->capture_default_str()->check(Int(1));
  ind->add_option("--latent-dqk", io->latent_dqk, "the sparse KL's latent q / key width (with --cuda)")
      ->capture_default_str()
      ->check(Int(80));
  ind->add_flag("!--no-materialized", io->materialized, "skip the materialised arm");
  ind->add_flag("--cuda", io->cuda, "the fused KLs on the GPU (bf16 inputs; the dense one, and the sparse one over\n"
                                    "the top-k table against latent queries); the materialised arm on the GPU is\n"
                                    "tests/cuda/torch_kl_bench.py");
  ind->callback([io] {
    for (int64_t s : io->seq_lens) HMLA_CHECK(s >= 1, ConfigError, "--s: sequence lengths must be positive, got ", s);
    HMLA_CHECK(io->latent_dqk % 16 == 0, ConfigError, "--latent-dqk must be a multiple of 16 (the latent width Rkv + Dr, "
               "Dr = 64), got ", io->latent_dqk);
    if (io->cuda) training_device("cuda");  // a clear error without a GPU
    bench::run_indexer_bench(*io, std::cout);
  });

  auto mo = std::make_shared<bench::WarmupMemoryOptions>();
  auto mem_s = std::make_shared<std::vector<int64_t>>();
  auto mem_g = std::make_shared<std::vector<std::string>>();
  CLI::App* mem = bench->add_subcommand(
      "warmup-memory",
      "Peak bytes of one attention core forward + backward: mha (phase 1), dsa_warmup (same core +\n"
      "indexer selection + fused dense KL) and the legacy full-table arm, in the PaddleFleet\n"
      "geometry (H 64, Dn 192, Dr 64, Dv 256, Rkv 512, HI 64, DI 128; s 1024-4096) and a small one\n"
      "(H = HI = 8; s 1024-16384); and a DeepSeek-V4-Flash CSA layer with H 2 of its 64 heads, HI 8\n"
      "of 64 (v4_csa_h2_i8: the dense core, + the dense CSA KL, the top-k path, the full [s, s/4]\n"
      "table; s 4096-32768).");
  mem->add_flag("--json", mo->json, "one JSON object per line");
  mem->add_option("--s", *mem_s, "sequence lengths for every geometry (default: per geometry)")->delimiter(',')->check(Int(1));
  mem->add_option("--geometry", *mem_g, "geometries to run (default: all: paddlefleet, small, v4_csa_h2_i8)")->delimiter(',');
  mem->add_flag("!--no-legacy", mo->legacy, "skip the legacy arm");
  mem->callback([mo, mem_s, mem_g] {
    if (!mem_g->empty()) {
      std::vector<std::string> names;
      for (const auto& g : mo->geometries) names.push_back(g.name);
      for (const auto& g : mo->csa_geometries) names.push_back(g.name);
      for (const std::string& n : *mem_g) {
        std::string known;
        for (const std::string& k : names) known += (known.empty() ? "" : ", ") + k;
        HMLA_CHECK(std::find(names.begin(), names.end(), n) != names.end(), ConfigError, "--geometry ", n,
                   ": no such geometry; the geometries are ", known);
      }
      auto dropped = [&](const auto& g) { return std::find(mem_g->begin(), mem_g->end(), g.name) == mem_g->end(); };
      std::erase_if(mo->geometries, dropped);
      std::erase_if(mo->csa_geometries, dropped);
    }
    if (!mem_s->empty()) {
      for (auto& g : mo->geometries) g.seq_lens = *mem_s;
      for (auto& g : mo->csa_geometries) g.seq_lens = *mem_s;
    }
    bench::run_warmup_memory_bench(*mo, std::cout);
  });

  auto so = std::make_shared<bench::SparseBenchOptions>();
  CLI::App* sp = bench->add_subcommand(
      "sparse",
      "Sparse latent MQA attention forward and forward+backward over the indexer's top-k on one\n"
      "causal document (default H 16 of DeepSeek's 128, to fit CPU time; 576/512 heads, K 2048).");
  sp->add_flag("--json", so->json, "one JSON object per line");
  sp->add_option("--s", so->seq_lens, "sequence lengths")->delimiter(',')->capture_default_str()->check(Int(1));
  sp->add_option("--heads", so->heads, "query heads H")->capture_default_str()->check(Int(1));
  sp->add_option("--dqk", so->dqk, "key width (Rkv + Dr)")->capture_default_str()->check(Int(1));
  sp->add_option("--dv", so->dv, "value width (Rkv), <= dqk")->capture_default_str()->check(Int(1));
  sp->add_option("--topk", so->topk, "K")->capture_default_str()->check(Int(1));
  sp->callback([so] {
    HMLA_CHECK(so->dv <= so->dqk, ConfigError, "--dv ", so->dv, " must be <= --dqk ", so->dqk);
    bench::run_sparse_bench(*so, std::cout);
  });

  auto to = std::make_shared<bench::TrainBenchOptions>();
  CLI::App* tr = bench->add_subcommand(
      "train",
      "hmla's whole training step (forward + backward + AdamW, f32) next to a PyTorch twin of the\n"
      "same model, weights and batch (tests/python/train_twin.py under Debian's python3 with\n"
      "python3-torch; SDPA with a document mask), interleaved rep by rep. JSON lines.");
  tr->add_flag("--json", to->json, "JSON lines (the only output format)");
  tr->add_option("--config", to->config, "HF config.json of the model")->capture_default_str();
  tr->add_option("--seq-len", to->seq_lens, "sequence lengths")->delimiter(',')->capture_default_str()->check(Int(8));
  tr->add_option("--mode", to->modes, "modes (mha, dsa_sparse, ...)")->delimiter(',')->capture_default_str();
  tr->add_option("--batch", to->batch, "rows per step")->capture_default_str()->check(Int(1));
  tr->add_option("--reps", to->reps, "timed steps per arm (after one warm-up)")->capture_default_str()
      ->check(Int(1, 1 << 20));  // an int
  tr->add_option("--python", to->python, "python with torch for the twin (\"\": hmla only)")->capture_default_str();
  tr->add_option("--twin", to->twin, "train_twin.py (default: the source tree's)");
  tr->add_option("--device", to->device, "cpu, or cuda: the step on the GPU (bench \"cuda-train\": model FLOPs,\n"
                                         "MFU against an H200's 989.5 dense bf16 TFLOP/s; the twin on the GPU for mha)")
      ->capture_default_str()
      ->check(OneOf({"cpu", "cuda"}, "device"));
  tr->callback([to] { bench::run_train_bench(*to, std::cout); });

  add_bench_v4_command(*bench);
  add_bench_ep_command(*bench);

  auto tk = std::make_shared<TokenizerBenchOptions>();
  CLI::App* tb = bench->add_subcommand(
      "tokenizer",
      "hmla's tokenizer.json encoder (the input's lines on N threads) next to Hugging Face tokenizers'\n"
      "encode_batch at RAYON_NUM_THREADS=N (tests/text/tokenizers_bench.py), ids checked equal. JSON lines.");
  tb->add_option("--tokenizer", tk->tokenizer, "a tokenizer.json or a directory holding one")->required();
  tb->add_option("--input", tk->input, "a text file (its lines are the texts)")->required();
  tb->add_option("--threads", tk->threads, "thread counts")->delimiter(',')->capture_default_str()
      ->check(Int(1, 1024));
  tb->add_option("--python", tk->python, "python with tokenizers==0.23.3 (\"\": hmla only)")->capture_default_str();
  tb->add_option("--script", tk->script, "tokenizers_bench.py (default: the source tree's)");
  tb->add_option("--reps", tk->reps, "timed passes (best of), after one warm-up")->capture_default_str()
      ->check(Int(1, 1000));
  tb->callback([tk] { run_tokenizer_bench(*tk, std::cout); });

  struct CpOpts {
    std::string config = "configs/deepseek_v32.json";
    std::vector<int64_t> seq_lens{8192}, ranks{2, 4, 8};
    int64_t batch = 1;
  };
  auto co = std::make_shared<CpOpts>();
  CLI::App* cpt = bench->add_subcommand(
      "cp-traffic",
      "Bytes one rank sends per MLA layer under context parallelism, per mode, as the layer sends\n"
      "them (mla_cp_traffic; `hmla layer --cp` checks its count against the wire), next to what\n"
      "gathering per-head K/V instead would send. JSON lines; f32 activations (CPU path).");
  cpt->add_option("--config", co->config, "HF config.json of the geometry")->capture_default_str()->check(CLI::ExistingFile);
  cpt->add_option("--s", co->seq_lens, "sequence lengths")->delimiter(',')->capture_default_str()->check(Int(1));
  cpt->add_option("--cp", co->ranks, "context-parallel ranks")->delimiter(',')->capture_default_str()->check(Int(1));
  cpt->add_option("--batch", co->batch, "rows per batch")->capture_default_str()->check(Int(1));
  cpt->callback([co] {
    const ModelConfig cfg = load_model_config(co->config);
    check_mla_layers(cfg, co->config);
    const int64_t H = cfg.num_attention_heads, Dqk = cfg.qk_head_dim(), Dv = cfg.v_head_dim;
    for (int64_t s : co->seq_lens)
      for (int64_t R : co->ranks) {
        HMLA_CHECK(R >= 1 && s % R == 0, ConfigError, "--cp ", R, " must divide --s ", s);
        for (LayerMode mode : {LayerMode::mha, LayerMode::mqa_full_causal, LayerMode::dsa_warmup, LayerMode::dsa_sparse}) {
          const bool backbone = mode != LayerMode::dsa_warmup;  // warmup trains the indexer only
          const CpTraffic t = mla_cp_traffic(cfg, mode, co->batch, s, R, backbone);
          const int64_t per_head_kv = co->batch * (s / R) * (R - 1) * int64_t(sizeof(float)) * H * (Dqk + Dv);
          std::cout << nlohmann::ordered_json{{"bench", "cp-traffic"}, {"config", co->config}, {"mode", mode_name(mode)},
                                      {"b", co->batch}, {"s", s}, {"cp", R}, {"backbone_backward", backbone},
                                      {"fwd_bytes", t.forward}, {"bwd_bytes", t.backward},
                                      {"total_bytes", t.forward + t.backward},
                                      {"per_head_kv_fwd_bytes", per_head_kv}}
                           .dump()
                    << "\n";
        }
      }
  });
}

}  // namespace hmla::app
