// The one contract of every op that takes an index table (DESIGN.md section 4): sparse
// attention, the sparse indexer KL, and their CLI and torch entry points. A table idx
// [b, sq, N] i32 lists, per query row t (global position q_row0 + row), key positions; -1 is no
// key. Any other entry must be a key of A(t) = [doc_start[t], t] and appear once in its row.
// Tables hmla's own indexer built satisfy it by construction and are not checked (TableOrigin::own);
// every other table is checked where it enters: here on the host (hmla.torch, the sparse KL) and
// by the sparse attention's backend check (on the GPU a device-side check).
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

// Where a table came from. external (the default of every op's inputs): a user's, a test's or the
// bench's table, checked by every op it enters. own: indexer_topk's or indexer_select's output for
// the same rows and layout, which the model passes on unchanged: ranked over R(t) inside A(t),
// window keys the last W of A(t) (disjoint from R(t)), each key once, -1 elsewhere (DESIGN.md
// section 5), so a check could only fail on a bug of the selection kernel, which its own tests
// cover (indexer_select against the CPU, the CPU against the rule). Checking own tables copies the
// table to the host (the sparse KL) or reads a verdict back (the sparse attention) each layer step.
enum class TableOrigin { external, own };

// Whether an op checks a table of this origin: external always; own only under the debug option
// HMLA_CHECK_TABLES=1 (read once per process), which checks every table as an external one.
bool table_checked(TableOrigin origin);
// The debug option for the scope of a test (what HMLA_CHECK_TABLES=1 sets); returns the previous.
bool set_check_all_tables(bool on);

// Returns the table to run: idx itself when every entry already follows the contract (nothing
// copied beyond the check), else (skip) a contiguous copy on idx's device with the invalid
// entries set to -1. `what` names the op in messages. A device table is checked on a host copy.
Tensor check_index_table(const Tensor& idx, const DocLayout& layout, int64_t q_row0, InvalidIndex mode,
                         const char* what);

}  // namespace hmla
