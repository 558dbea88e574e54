// NCCL behind Comm's device collectives (built with CUDA, NCCL and MPI): one communicator per
// Comm group, created collectively on first use from an id rank 0 broadcasts over MPI. Each rank
// drives the GPU it owns (local rank modulo the visible devices). Calls block until done.
#pragma once
#include <cstdint>
#include <memory>

namespace hmla::nccl {

struct Group;
// `mpi_comm` points to the group's MPI_Comm.
std::shared_ptr<Group> create(const void* mpi_comm, int rank, int size);
void allreduce_sum(Group& g, float* x, int64_t n);
void allreduce_sum(Group& g, double* x, int64_t n);
void allgather(Group& g, const void* send, void* recv, int64_t nbytes);
void reduce_scatter_sum(Group& g, const float* send, float* recv, int64_t n);
// Point-to-point pairs in one group call: send_bytes[r] from send's r-th block to rank r,
// recv_bytes[r] from rank r into recv's r-th block (blocks in rank order, packed).
void alltoallv(Group& g, const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes);

}  // namespace hmla::nccl
