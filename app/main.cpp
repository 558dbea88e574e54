// hmla: hybrid-MLA training through the DeepSeek Sparse Attention programme. One binary with
// subcommands; errors print one line to stderr and exit non-zero.
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <new>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/dist/comm.h"
#include "hmla/train/trainer.h"
#include "stdout.h"

namespace {
// One rank failing ends the whole job (MPI_Abort under mpirun), never a hang.
// The message stays one line whatever it quotes (a file's text, a library's message).
[[noreturn]] void fail(std::string msg, int code) {
  for (char& ch : msg)
    if (ch == '\n' || ch == '\r') ch = ' ';
  hmla::Comm& c = hmla::Comm::world();
  hmla::Comm::world().abort(c.size() > 1 ? msg + " (rank " + std::to_string(c.rank()) + ")" : msg, code);
}

// libstdc++ words it "filesystem error: cannot create directories: Read-only file system [/x]";
// users read the path first, then what failed.
std::string describe(const std::filesystem::filesystem_error& e) {
  std::string op = e.what();
  const std::string prefix = "filesystem error: ", reason = e.code().message();
  if (op.rfind(prefix, 0) == 0) op.erase(0, prefix.size());
  if (const size_t at = op.find(": " + reason); at != std::string::npos) op.erase(at);
  std::string lower = reason;
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  std::string paths = e.path1().string();
  if (!e.path2().empty()) paths += " and " + e.path2().string();
  return (paths.empty() ? "" : paths + ": ") + op + ": " + lower;
}

// OpenMP's thread count, checked before the first parallel region: libgomp creates the threads
// there and ends the process with its own message ("Thread creation failed") when it cannot.
// hmla splits rows across threads and gains nothing past the machine's cores; 1024 is above the
// hardware threads of today's largest machines and far below the 4096 at which thread creation
// failed (each thread reserves its stack). A comma list sets nested levels; each is checked.
void check_omp_num_threads() {
  constexpr long kMaxThreads = 1024;
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (!env) return;
  const std::string text = env;
  std::string item;
  for (std::istringstream in(text); std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    const long n = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    HMLA_CHECK(!item.empty() && *end == '\0' && n >= 1 && n <= kMaxThreads, hmla::ConfigError, "OMP_NUM_THREADS = '",
               text, "': it must be an integer in [1, ", kMaxThreads,
               "] (or a comma list of them); unset it to use every core");
  }
}

// CLI11's own errors (unknown option, validator messages) in hmla's one-line form.
std::string cli_failure(const CLI::App* app, const CLI::Error& e) {
  std::string cmd = "hmla";
  for (const CLI::App* a = app; !a->get_subcommands().empty();) {
    a = a->get_subcommands().front();
    cmd += " " + a->get_name();
  }
  return std::string("hmla: error: ") + e.what() + " (see " + cmd + " --help)\n";
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hmla: hybrid multi-head latent attention training (DeepSeek Sparse Attention)"};
  app.require_subcommand(1);
  app.failure_message(cli_failure);
  app.set_version_flag("--version", "hmla 0.1.0");
  hmla::app::add_bench_command(app);
  hmla::app::add_attention_command(app);
  hmla::app::add_layer_command(app);
  hmla::app::add_train_commands(app);
  hmla::app::add_model_commands(app);
  hmla::app::add_report_command(app);
  hmla::app::add_text_commands(app);
  hmla::app::add_ops_command(app);
  hmla::app::add_plan_command(app);
  try {
    check_omp_num_threads();
    app.parse(argc, argv);
    hmla::app::flush_stdout();  // every command's output, written or an error
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const hmla::Interrupted& e) {
    std::cerr << "hmla: " << e.what() << "\n";
    return 130;
  } catch (const hmla::Error& e) {
    fail(std::string("hmla: error: ") + e.what(), 1);
  } catch (const std::filesystem::filesystem_error& e) {
    fail("hmla: error: " + describe(e), 1);
  } catch (const std::bad_alloc&) {
    fail("hmla: error: out of memory: an allocation failed; reduce batch, seq_len or the model's sizes", 1);
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("hmla: error: a JSON file holds a value of the wrong type or shape: ") + e.what(), 1);
  } catch (const std::exception& e) {
    fail(std::string("hmla: internal error: ") + e.what(), 2);
  }
  return 0;
}
