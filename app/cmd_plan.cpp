// `hmla plan`: one rank's memory and all-to-all bytes under a layout of context, data and expert
// parallelism and ZeRO-1, and whether it fits a device (docs/scale_out.md, "The plan"); --search
// lists the smallest layouts that fit. Nothing is allocated, no device is needed.
#include <iostream>

#include "commands.h"
#include "hmla/core/error.h"
#include "hmla/train/scale_plan.h"
#include "validators.h"

namespace hmla::app {

void add_plan_command(CLI::App& app) {
  struct PlanOpts {
    std::string config, device = "cuda", device_memory = "141GB";
    ScaleLayout layout;
    std::vector<int64_t> seq_lens;
    int64_t micro_batch = 1;
    bool search = false;
  };
  auto o = std::make_shared<PlanOpts>();
  CLI::App* plan = app.add_subcommand(
      "plan",
      "One rank's memory (parameters, gradients, optimizer state, a micro-batch's activations) and\n"
      "all-to-all bytes per step under --ranks, --ep, --cp and --shard-optimizer, and whether it fits\n"
      "--device-memory (docs/scale_out.md). Nothing is allocated; no device is needed.");
  plan->add_option("config", o->config, "a programme (.yaml: its phases, seq_len and micro-batch rows) or a\n"
                                        "model config (.json)")
      ->required()
      ->check(CLI::ExistingFile);
  plan->add_option("--ranks", o->layout.ranks, "the world size")->capture_default_str()->check(Int(1, 1 << 20));
  plan->add_option("--ep", o->layout.ep, "expert-parallel ranks: each MoE layer's routed experts split over them\n"
                                         "(divides --ranks / --cp and n_routed_experts)")
      ->capture_default_str()
      ->check(Int(1, 1 << 20));
  plan->add_option("--cp", o->layout.cp, "context-parallel ranks per replica (divides --ranks and seq_len)")
      ->capture_default_str()
      ->check(Int(1, 1 << 20));
  plan->add_flag("--shard-optimizer", o->layout.shard_optimizer,
                 "ZeRO-1: the optimizer state split over the data-parallel ranks");
  plan->add_option("--device-memory", o->device_memory, "each device's memory: bytes with an optional KB, MB, GB, TB\n"
                                                        "(powers of 1000) or KiB, MiB, GiB, TiB suffix")
      ->capture_default_str();
  plan->add_option("--device", o->device, "the dtypes: cuda (bf16 compute copy and activations) or cpu (f32)")
      ->capture_default_str()
      ->check(OneOf({"cpu", "cuda"}, "device"));
  plan->add_option("--seq-len", o->seq_lens, "sequence lengths, e.g. 4096,65536 (a programme: every phase's\n"
                                             "seq_len replaced; a model config: default 4096)")
      ->delimiter(',')
      ->check(Int(2, int64_t(1) << 40));
  plan->add_option("--micro-batch", o->micro_batch, "a model config's rows per micro-batch (a programme: its own)")
      ->capture_default_str()
      ->check(Int(1, 1 << 20));
  plan->add_flag("--search", o->search, "for --ranks 8, 16, ..., 1024, the smallest layouts (ep, cp, ZeRO-1) that\n"
                                        "fit, per sequence length (--ranks, --ep, --cp, --shard-optimizer unused)");
  plan->callback([o, plan] {
    const int64_t device_bytes = parse_device_memory(o->device_memory);
    const bool yaml = o->config.ends_with(".yaml") || o->config.ends_with(".yml");
    HMLA_CHECK(!yaml || plan->count("--micro-batch") == 0, ConfigError,
               "--micro-batch is a model config's (.json); a programme's micro-batch rows are batch / micro_batches");
    HMLA_CHECK(!o->search || (plan->count("--ranks") + plan->count("--ep") + plan->count("--cp") +
                              plan->count("--shard-optimizer")) == 0,
               ConfigError, "--search tries every layout: drop --ranks, --ep, --cp and --shard-optimizer");
    const std::vector<PlanCase> cases = plan_cases(o->config, o->seq_lens, o->micro_batch);
    const Device dev = o->device == "cpu" ? Device::cpu : Device::cuda;
    if (o->search) {
      std::cout << layout_search(cases, dev, device_bytes);
      return;
    }
    for (const PlanCase& pc : cases) check_layout(pc, o->layout);  // every refusal before any output
    std::cout << rank_plan_report(cases, o->layout, dev, device_bytes);
  });
}

}  // namespace hmla::app
