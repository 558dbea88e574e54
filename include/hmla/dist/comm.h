// The process group of a run (DESIGN.md section 8). Under mpirun it is MPI_COMM_WORLD (MPI is
// initialised on first use and finalised at exit); otherwise, or in a build without MPI, it is a
// single rank and every collective is the identity. Sums are SUM all-reduces.
#pragma once
#include <cstdint>
#include <string>

namespace hmla {

class Comm {
 public:
  static Comm& world();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  void allreduce_sum(float* x, int64_t n);
  void allreduce_sum(double* x, int64_t n);
  void allreduce_sum(int64_t* x, int64_t n);
  void barrier();
  // Ends every rank of the job (MPI_Abort) after printing `msg` on this one; a plain exit when
  // there is a single rank.
  [[noreturn]] void abort(const std::string& msg, int code);

 private:
  Comm();
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
};

}  // namespace hmla
