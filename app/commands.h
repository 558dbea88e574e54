// Subcommands of the hmla CLI; each adds itself to the app with its options and callback.
#pragma once
#include <CLI/CLI.hpp>

namespace hmla::app {

void add_bench_command(CLI::App& app);
void add_bench_v4_command(CLI::App& bench);  // `hmla bench v4` (cmd_bench_v4.cpp)
void add_bench_ep_command(CLI::App& bench);  // `hmla bench ep` (cmd_bench_v4.cpp)
void add_attention_command(CLI::App& app);
void add_layer_command(CLI::App& app);
void add_train_commands(CLI::App& app);
void add_model_commands(CLI::App& app);
void add_report_command(CLI::App& app);
void add_text_commands(CLI::App& app);  // tokenize
void add_ops_command(CLI::App& app);    // the support matrix
void add_plan_command(CLI::App& app);   // one rank's memory under a parallel layout
}  // namespace hmla::app
