// A named tensor of a parameter table (name and shape): what the model, the layer and the
// indexer declare, and what the arenas, the optimizer and checkpoint I/O walk in order.
#pragma once
#include <string>

#include "hmla/core/tensor.h"

namespace hmla {

struct ParamSpec {
  std::string name;  // without the "model.layers.{L}.self_attn." prefix in layer tables
  Shape shape;
};

}  // namespace hmla
