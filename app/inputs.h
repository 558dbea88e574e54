// The tensors a command reads from a safetensors file, checked by name in one place: each named
// tensor's dtype and shape (dimensions as symbols such as b and s, the same size wherever they
// occur), required ones present, and nothing the command would silently ignore.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "hmla/io/safetensors.h"

namespace hmla::app {

struct InputSpec {
  std::string name;
  std::vector<std::string> dims;  // symbols ("b", "s", "hidden"); each size must be >= 1
  std::vector<DType> dtypes;      // any of these
  enum Presence { required, optional, forbidden } presence = required;
  std::string note{};  // why it is forbidden (or a hint when it is missing)
};

// Sizes of the dimension symbols, e.g. {"b": 2, "s": 64}.
using DimSizes = std::map<std::string, int64_t>;

// Checks the tensors of `file` against `specs` in order: the first tensor that carries a symbol
// fixes its size, unless `bound` fixes it beforehand (e.g. hidden from the config). IoError
// naming the file, the tensor, and what was expected otherwise. Returns every symbol's size.
DimSizes check_inputs(const io::TensorMap& tensors, const std::vector<InputSpec>& specs, const std::string& file,
                      DimSizes bound = {});

}  // namespace hmla::app
