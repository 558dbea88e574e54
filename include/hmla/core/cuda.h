// What the CUDA backend reports about the machine. Without a CUDA build or a device, hmla runs
// on the CPU alone and these say so.
#pragma once
#include <string>

namespace hmla {

bool cuda_built();            // compiled with the CUDA backend
int cuda_device_count();      // 0 without a driver or a device
std::string cuda_device_name(int device);

}  // namespace hmla
