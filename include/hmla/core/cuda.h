// What the CUDA backend reports about the machine. Without a CUDA build or a device, hmla runs
// on the CPU alone and these say so.
#pragma once
#include <cstdint>
#include <string>

namespace hmla {

bool cuda_built();            // compiled with the CUDA backend
int cuda_device_count();      // 0 without a driver or a device
std::string cuda_device_name(int device);
// Makes this process's device the GPU of its rank among the ranks on its node (Open MPI, MPICH/PMI
// or Slurm's local rank, else `world_rank`), modulo the devices; returns it. Call before anything
// is allocated on the device (the trainer does; NCCL's communicator uses the same device).
int cuda_select_device(int world_rank);

}  // namespace hmla
