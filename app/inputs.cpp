// check_inputs: one table per command instead of scattered checks (inputs.h).
#include "inputs.h"

#include <algorithm>
#include <sstream>

namespace hmla::app {

namespace {

std::string dtypes_str(const std::vector<DType>& dts) {
  std::string s;
  for (size_t i = 0; i < dts.size(); ++i) s += std::string(i ? " or " : "") + dtype_name(dts[i]);
  return s;
}

// "[b, s, hidden] = [2, 64, ?]" with the sizes known so far.
std::string expected_str(const InputSpec& sp, const DimSizes& sizes) {
  std::ostringstream sym, val;
  for (size_t i = 0; i < sp.dims.size(); ++i) {
    sym << (i ? ", " : "") << sp.dims[i];
    auto it = sizes.find(sp.dims[i]);
    val << (i ? ", " : "") << (it == sizes.end() ? std::string("?") : std::to_string(it->second));
  }
  return dtypes_str(sp.dtypes) + " [" + sym.str() + "] = [" + val.str() + "]";
}

std::string known_names(const std::vector<InputSpec>& specs) {
  std::string s;
  for (const InputSpec& sp : specs)
    if (sp.presence != InputSpec::forbidden) s += std::string(s.empty() ? "" : ", ") + sp.name;
  return s;
}

void check_one(const Tensor& t, const InputSpec& sp, DimSizes& sizes, const std::string& file) {
  DimSizes with = sizes;
  bool ok = std::find(sp.dtypes.begin(), sp.dtypes.end(), t.dtype()) != sp.dtypes.end() &&
            t.dim() == int64_t(sp.dims.size());
  for (size_t i = 0; ok && i < sp.dims.size(); ++i) {
    auto [it, fresh] = with.emplace(sp.dims[i], t.size(int64_t(i)));
    ok = it->second == t.size(int64_t(i)) && t.size(int64_t(i)) >= 1;
  }
  HMLA_CHECK(ok, IoError, file, ": ", sp.name, " must be ", expected_str(sp, ok ? with : sizes), ", got ",
             dtype_name(t.dtype()), " ", shape_str(t.shape()));
  sizes = with;
}

}  // namespace

DimSizes check_inputs(const io::TensorMap& tensors, const std::vector<InputSpec>& specs, const std::string& file,
                      DimSizes bound) {
  for (const auto& [name, t] : tensors) {
    auto it = std::find_if(specs.begin(), specs.end(), [&](const InputSpec& sp) { return sp.name == name; });
    HMLA_CHECK(it != specs.end() && it->presence != InputSpec::forbidden, IoError, file, ": unexpected tensor '", name,
               "'", it != specs.end() && !it->note.empty() ? " (" + it->note + ")" : "",
               "; this command reads ", known_names(specs));
  }
  for (const InputSpec& sp : specs) {
    auto it = tensors.find(sp.name);
    if (it == tensors.end()) {
      HMLA_CHECK(sp.presence != InputSpec::required, IoError, file, ": tensor '", sp.name, "' (",
                 expected_str(sp, bound), ") is missing", sp.note.empty() ? "" : " (" + sp.note + ")");
      continue;
    }
    check_one(it->second, sp, bound, file);
  }
  return bound;
}

}  // namespace hmla::app
