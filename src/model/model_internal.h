// What model.cpp and model_tables.cpp share, private to src/model.
#pragma once
#include <algorithm>
#include <cstdint>

namespace hmla {

// The LM head and its loss run over this many rows at a time, so their logits and the logits'
// gradient (2 x rows x vocab_size f32) stay within 2 x 32 MiB: the [tokens, vocab] matrix of a
// step is never whole. A batch within one chunk computes exactly as one unchunked call.
inline constexpr int64_t kHeadChunkElems = int64_t(1) << 23;
inline int64_t head_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, kHeadChunkElems / vocab); }

}  // namespace hmla
