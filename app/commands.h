// Subcommands of the hmla CLI; each adds itself to the app with its options and callback.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "hmla/core/tensor.h"

namespace hmla::app {

// The values of an i32 or i64 tensor (token ids, cu_seqlens, end rows); IoError otherwise.
std::vector<int64_t> index_values(const Tensor& t, const std::string& what);

void add_bench_command(CLI::App& app);
void add_attention_command(CLI::App& app);
void add_layer_command(CLI::App& app);
void add_train_commands(CLI::App& app);
void add_model_commands(CLI::App& app);
void add_report_command(CLI::App& app);
}  // namespace hmla::app
