// The Exact instances (the float64 oracle and the naive float32 implementation); the template is
// in the header so that tests/cuda can instantiate it with its bf16 rounding.
#include "attn_sparse_ref.h"

namespace hmla::ref {

template SparseRefResult<double> attn_sparse_ref<double>(const SparseDims&, const std::vector<double>&,
                                                         const std::vector<double>&, const std::vector<int32_t>&,
                                                         const std::vector<double>&, double,
                                                         const std::vector<double>&);
template SparseRefResult<float> attn_sparse_ref<float>(const SparseDims&, const std::vector<float>&,
                                                       const std::vector<float>&, const std::vector<int32_t>&,
                                                       const std::vector<float>&, float, const std::vector<float>&);

}  // namespace hmla::ref
