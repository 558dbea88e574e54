// One micro-batch as the loader hands it to the model: token ids [b, s] and their document layout
// (DESIGN.md section 3). A header of its own so that the data module and the model share it
// without either including the other.
#pragma once
#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

struct Batch {
  Tensor input_ids;  // [b, s] i32
  DocLayout layout;
};

}  // namespace hmla
