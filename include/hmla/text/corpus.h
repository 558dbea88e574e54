// Corpus readers for prepare-data: what a command line names (files, directories, globs, Megatron
// prefixes) as a sorted list of inputs, and each input's documents, streamed in chunks (plain or
// zstd-compressed; text split at separator lines, or JSON Lines with one text field per line).
// Memory is bounded by the chunk and the longest document, never by the size of a file.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace hmla::text {

enum class InputKind { text, jsonl, megatron };

struct CorpusInput {
  std::string path;  // a file; for megatron the prefix (PREFIX.bin + PREFIX.idx)
  InputKind kind = InputKind::text;
  bool zstd = false;  // *.zst: decompressed as it is read (any number of frames)
  uint64_t bytes = 0;  // its size on disk (for megatron, the .bin's): progress and ETA
};

// Each argument is a regular file, a directory (its files, recursively, in sorted path order,
// hidden ones left out), a glob (*, ? and [...] expanded by hmla, matches sorted; a matched
// directory expands as a directory), or a Megatron prefix: PREFIX, PREFIX.idx or PREFIX.bin
// with both files present. The kind comes from the name: *.jsonl and *.jsonl.zst are JSON Lines,
// *.bin / *.idx of a pair are Megatron, anything else text (*.zst decompressed first). One
// argument naming nothing, or a glob matching nothing, is a ConfigError naming it.
std::vector<CorpusInput> expand_inputs(const std::vector<std::string>& args);

// True when `arg` names a Megatron dataset (PREFIX, PREFIX.idx or PREFIX.bin with both files
// present); sets `prefix`.
bool megatron_prefix(const std::string& arg, std::string& prefix);

// JSON Lines, one document per line: the line must be a JSON object whose `text_key` member is
// a string. Blank lines are ignored. A line that is not valid JSON (or not an object), lacks the
// key, or holds a non-string there is skipped and counted (prepare-data's summary reports the
// counts); with `strict` the first such line is an IoError "FILE:LINE: ..." instead.
struct CorpusOptions {
  std::string separator = "%";  // text: a line equal to this ends a document ("" a blank line)
  std::string text_key = "text";
  bool strict = false;
};

struct CorpusCounts {
  uint64_t bytes_read = 0;  // input bytes consumed (compressed bytes for *.zst)
  int64_t lines_invalid = 0, lines_missing_key = 0, lines_not_string = 0;
  int64_t skipped() const { return lines_invalid + lines_missing_key + lines_not_string; }
};

// Calls `doc` with each document of a text or jsonl input, in file order (for text, today's rule:
// each line with its "\n", documents split at separator lines; whitespace-only documents are
// passed too, prepare-data drops them). IoError on a read error or corrupt zstd data.
void read_documents(const CorpusInput& in, const CorpusOptions& opt, CorpusCounts& counts,
                    const std::function<void(std::string&&)>& doc);

}  // namespace hmla::text
