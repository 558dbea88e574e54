#include "hmla/dist/comm.h"

#include <cstdlib>
#include <iostream>

#ifdef HMLA_HAVE_MPI
#include <mpi.h>
#endif

namespace hmla {

namespace {
// Launched by an MPI launcher (Open MPI, MPICH/PMI, Slurm's PMI)?
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}
}  // namespace

Comm::Comm() {
#ifdef HMLA_HAVE_MPI
  if (!launched_by_mpi()) return;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    MPI_Init(nullptr, nullptr);
    std::atexit([] {
      int fin = 0;
      MPI_Finalized(&fin);
      if (!fin) MPI_Finalize();
    });
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  mpi_ = true;
#endif
}

Comm& Comm::world() {
  static Comm c;
  return c;
}

#ifdef HMLA_HAVE_MPI
#define HMLA_ALLREDUCE(T, MPI_T)                                                        \
  void Comm::allreduce_sum(T* x, int64_t n) {                                           \
    if (!mpi_ || size_ == 1) return;                                                    \
    for (int64_t off = 0; off < n; off += (int64_t(1) << 30)) {                         \
      const int count = int(std::min<int64_t>(n - off, int64_t(1) << 30));              \
      MPI_Allreduce(MPI_IN_PLACE, x + off, count, MPI_T, MPI_SUM, MPI_COMM_WORLD);      \
    }                                                                                   \
  }
HMLA_ALLREDUCE(float, MPI_FLOAT)
HMLA_ALLREDUCE(double, MPI_DOUBLE)
HMLA_ALLREDUCE(int64_t, MPI_INT64_T)
#undef HMLA_ALLREDUCE

void Comm::barrier() {
  if (mpi_) MPI_Barrier(MPI_COMM_WORLD);
}

void Comm::abort(const std::string& msg, int code) {
  std::cerr << msg << std::endl;
  if (mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}
#else
void Comm::allreduce_sum(float*, int64_t) {}
void Comm::allreduce_sum(double*, int64_t) {}
void Comm::allreduce_sum(int64_t*, int64_t) {}
void Comm::barrier() {}
void Comm::abort(const std::string& msg, int code) {
  std::cerr << msg << std::endl;
  std::exit(code);
}
#endif

}  // namespace hmla
