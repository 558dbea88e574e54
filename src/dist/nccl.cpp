// NCCL behind Comm's device collectives (nccl.h): a communicator per group, created on first use
// from an id rank 0 broadcasts over MPI; calls block until the device is done.
#include "nccl.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdlib>

#include "hmla/core/error.h"

namespace hmla::nccl {

namespace {
void check(ncclResult_t r, const char* what) {
  HMLA_CHECK(r == ncclSuccess, Error, what, ": ", ncclGetErrorString(r));
}
void check(cudaError_t e, const char* what) { HMLA_CHECK(e == cudaSuccess, Error, what, ": ", cudaGetErrorString(e)); }

}  // namespace

struct Group {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  ~Group() {
    if (comm) ncclCommDestroy(comm);
    if (stream) cudaStreamDestroy(stream);
  }
  void sync() { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize after an NCCL collective"); }
};

std::shared_ptr<Group> create(const void* mpi_comm, int rank, int size) {
  MPI_Comm mc = *static_cast<const MPI_Comm*>(mpi_comm);
  int devices = 0;
  check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  HMLA_CHECK(devices > 0, Error, "device collectives need a GPU on every rank");
  // The communicator is on the current device: the caller selected it (cuda_select_device, by the
  // world rank, before anything was allocated), so a CP group's ranks keep their devices.
  ncclUniqueId id;
  if (rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mc);
  auto g = std::make_shared<Group>();
  check(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(ncclCommInitRank(&g->comm, size, id, rank), "ncclCommInitRank");
  return g;
}

// The buffers come from kernels on hmla's own stream: wait for every stream of the device first
// (the collectives run on the group's stream and are waited for too).
void after_device_work() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before an NCCL collective"); }

void allreduce_sum(Group& g, float* x, int64_t n) {
  after_device_work();
  check(ncclAllReduce(x, x, size_t(n), ncclFloat32, ncclSum, g.comm, g.stream), "ncclAllReduce");
  g.sync();
}

void allreduce_sum(Group& g, double* x, int64_t n) {
  after_device_work();
  check(ncclAllReduce(x, x, size_t(n), ncclFloat64, ncclSum, g.comm, g.stream), "ncclAllReduce");
  g.sync();
}

void allgather(Group& g, const void* send, void* recv, int64_t nbytes) {
  after_device_work();
  check(ncclAllGather(send, recv, size_t(nbytes), ncclUint8, g.comm, g.stream), "ncclAllGather");
  g.sync();
}

void reduce_scatter_sum(Group& g, const float* send, float* recv, int64_t n) {
  after_device_work();
  check(ncclReduceScatter(send, recv, size_t(n), ncclFloat32, ncclSum, g.comm, g.stream), "ncclReduceScatter");
  g.sync();
}

void alltoallv(Group& g, const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) {
  after_device_work();
  int size = 0;
  check(ncclCommCount(g.comm, &size), "ncclCommCount");
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  check(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < size; ++peer) {
    if (send_bytes[peer] > 0) check(ncclSend(s, size_t(send_bytes[peer]), ncclUint8, peer, g.comm, g.stream), "ncclSend");
    if (recv_bytes[peer] > 0) check(ncclRecv(r, size_t(recv_bytes[peer]), ncclUint8, peer, g.comm, g.stream), "ncclRecv");
    s += send_bytes[peer], r += recv_bytes[peer];
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  g.sync();
}

}  // namespace hmla::nccl
