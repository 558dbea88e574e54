// The one contract of every op that takes an index table (DESIGN.md section 4): sparse
// attention, the sparse indexer KL, and their CLI and torch entry points. A table idx
// [b, sq, N] i32 lists, per query row t (global position q_row0 + row), key positions; -1 is no
// key. Any other entry must be a key of A(t) = [doc_start[t], t] and appear once in its row.
// Tables hmla's own indexer built satisfy it by construction; user tables are checked here, once,
// at the API boundary.
#pragma once
#include <cstdint>

#include "hmla/core/layout.h"
#include "hmla/core/tensor.h"

namespace hmla {

// error: an entry other than -1 outside A(t) (negative, >= s, a later position, another
//        document) is a ShapeError naming it.
// skip:  such entries are no key (FlashMLA's and TileLang's convention for < 0 or >= s, TileLang's
//        and Megatron-LM's references mask later positions and other documents), for users
//        porting from them. Duplicates are an error in both modes.
enum class InvalidIndex { error, skip };

// Returns the table to run: idx itself when every entry already follows the contract (nothing
// copied beyond the check), else (skip) a contiguous copy on idx's device with the invalid
// entries set to -1. `what` names the op in messages. A device table is checked on a host copy.
Tensor check_index_table(const Tensor& idx, const DocLayout& layout, int64_t q_row0, InvalidIndex mode,
                         const char* what);

}  // namespace hmla
