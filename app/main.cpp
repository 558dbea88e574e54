// hmla: hybrid-MLA training through the DeepSeek Sparse Attention programme. One binary with
// subcommands; errors print one line to stderr and exit non-zero.
#include <iostream>

#include "commands.h"
#include "hmla/core/cuda.h"
#include "hmla/core/error.h"
#include "hmla/dist/comm.h"
#include "hmla/train/trainer.h"

namespace {
// One rank failing ends the whole job (MPI_Abort under mpirun), never a hang.
[[noreturn]] void fail(const std::string& msg, int code) {
  hmla::Comm& c = hmla::Comm::world();
  hmla::Comm::world().abort(c.size() > 1 ? msg + " (rank " + std::to_string(c.rank()) + ")" : msg, code);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hmla: hybrid multi-head latent attention training (DeepSeek Sparse Attention)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "hmla 0.1.0");
  hmla::app::add_bench_command(app);
  hmla::app::add_attention_command(app);
  hmla::app::add_layer_command(app);
  hmla::app::add_train_commands(app);
  hmla::app::add_model_commands(app);
  hmla::app::add_report_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const hmla::Interrupted& e) {
    std::cerr << "hmla: " << e.what() << "\n";
    return 130;
  } catch (const hmla::Error& e) {
    fail(std::string("hmla: error: ") + e.what(), 1);
  } catch (const std::exception& e) {
    fail(std::string("hmla: internal error: ") + e.what(), 2);
  }
  return 0;
}
