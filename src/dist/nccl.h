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

}  // namespace hmla::nccl
