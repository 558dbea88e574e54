// Process groups (DESIGN.md section 8). Comm::world() is MPI_COMM_WORLD under mpirun (MPI is
// initialised on first use and finalised at exit); otherwise, or in a build without MPI, it is a
// single rank and every collective is the identity. split() makes subgroups (the context-parallel
// group of a 2-D rank grid). Sums are SUM reductions; every rank of a group must call each
// collective in the same order.
//
// Buffers live on the device named by `dev`: CUDA buffers go through NCCL when the build has it
// (the path GPU ranks take; each rank drives the GPU of its local rank), else they are staged
// through host memory and MPI.
//
// bytes_sent() counts what this rank sends through all-gathers and reduce-scatters, as the ring
// algorithm sends it: (size - 1) blocks of the per-rank size for either, and through all-to-alls
// the bytes it sends to the other ranks (its own block stays). All-reduces (gradients, counters)
// are not counted.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hmla/core/allocator.h"

namespace hmla {

class Comm {
 public:
  static Comm& world();
  static Comm& self();  // always one rank
  // Ranks with equal `color` form one group, ordered by `key`. Collective over this group.
  Comm split(int color, int key) const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  void allreduce_sum(float* x, int64_t n, Device dev = Device::cpu);
  void allreduce_sum(double* x, int64_t n, Device dev = Device::cpu);
  void allreduce_sum(int64_t* x, int64_t n);
  void allreduce_max(double* x, int64_t n);
  // recv bytes [r * n, (r + 1) * n) = rank r's send bytes [0, n).
  void allgather(const void* send, void* recv, int64_t nbytes, Device dev = Device::cpu);
  // recv[0 .. n) = sum over ranks of their send[rank() * n .. (rank() + 1) * n).
  void reduce_scatter_sum(const float* send, float* recv, int64_t n, Device dev = Device::cpu);
  // recv bytes [r * n, (r + 1) * n) = rank r's send bytes [rank() * n, (rank() + 1) * n).
  void alltoall(const void* send, void* recv, int64_t nbytes, Device dev = Device::cpu);
  // The same with a size per pair: send_bytes[r] bytes to rank r (send's blocks in rank order),
  // recv_bytes[r] from rank r (recv's blocks in rank order); recv_bytes[r] must be what rank r
  // sends here (the caller exchanged the counts, e.g. by alltoall). send and recv do not overlap.
  void alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                 const std::vector<int64_t>& recv_bytes, Device dev = Device::cpu);
  static bool nccl_built();
  void barrier();
  int64_t bytes_sent() const { return bytes_sent_; }
  // Ends every rank of the job (MPI_Abort) after printing `msg` on this one; a plain exit when
  // there is a single rank.
  [[noreturn]] void abort(const std::string& msg, int code);

  struct Handle;  // the MPI communicator, when there is one

 private:
  Comm() = default;
  int rank_ = 0, size_ = 1;
  int64_t bytes_sent_ = 0;
  std::shared_ptr<Handle> mpi_;
};

}  // namespace hmla
