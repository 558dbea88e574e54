// safetensors read and write (f32, bf16, i32, i64; F8_E4M3 kept as stored bytes). Reading
// validates everything before it touches the data: header length, JSON, dtypes, shapes, offsets
// within the file, overlaps; any defect is an IoError naming the file and the tensor. Writing
// goes to a temporary file in the same directory that is renamed into place, so a failed save
// leaves the old file intact.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "hmla/core/tensor.h"

namespace hmla::io {

using TensorMap = std::map<std::string, Tensor>;  // name -> CPU tensor
using Metadata = std::map<std::string, std::string>;  // the header's __metadata__

// A tensor kept as its file stores it: the safetensors dtype name ("F8_E4M3", "BF16", ...), the
// shape and the bytes. What hmla does not compute in (FP8 weights before dequantization) and what
// it carries without reading (the multi-token-prediction layers) travel in this form.
struct StoredTensor {
  std::string dtype;
  Shape shape;
  std::string bytes;
};
using StoredMap = std::map<std::string, StoredTensor>;
StoredTensor stored_tensor(const Tensor& t);  // a CPU tensor's bytes as its file would store them

// With `metadata`, the header's __metadata__ is stored there (its values must be strings either way).
// With `fp8`, F8_E4M3 tensors are stored there as read (checkpoint_forms.h dequantizes them);
// without it they are an error, as every other F8 type is either way.
TensorMap load_safetensors(const std::string& path, Metadata* metadata = nullptr, StoredMap* fp8 = nullptr);
// Parses an in-memory file; `what` names it in error messages.
TensorMap parse_safetensors(const std::string& bytes, const std::string& what, Metadata* metadata = nullptr,
                            StoredMap* fp8 = nullptr);

// A checkpoint's tensors: `path` is a .safetensors file, an index (model.safetensors.index.json,
// the sharded form: {"weight_map": {name: shard file}}), or a directory holding either.
// `fp8` as load_safetensors's, over every shard.
TensorMap load_checkpoint_tensors(const std::string& path, StoredMap* fp8 = nullptr);

// `stored` tensors are written as they are (their names must differ from the tensors').
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {}, const StoredMap& stored = {});
std::string serialize_safetensors(const TensorMap& tensors, const std::map<std::string, std::string>& metadata = {},
                                  const StoredMap& stored = {});

// The 8-byte length and the padded JSON header of a file holding `entries` (safetensors dtype name,
// shape and byte count, laid out in name order), exactly as serialize_safetensors writes them: a
// writer that streams the data block after it produces the same file.
struct TensorEntry {
  std::string dtype;
  Shape shape;
  uint64_t nbytes = 0;
};
std::string safetensors_header(const std::map<std::string, TensorEntry>& entries, const Metadata& metadata = {});

// A file written piece by piece, atomically and durably as write_file_atomic writes it: a
// temporary in the target's directory that commit() fsyncs and renames into place (then the
// directory is fsynced). Destroyed uncommitted (an error on the way), it removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* data, size_t n);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// Writes bytes to path atomically and durably: a temporary file in the same directory, fsynced,
// renamed into place, then the directory fsynced (a power loss leaves the old file or the new one).
// The target must be a regular file or a new path (io::check_output_file): anything else is
// refused. Temporaries that killed writers left for the same target are removed first.
void write_file_atomic(const std::string& path, const std::string& bytes);
// A regular file's bytes (io::open_input_file: a FIFO, directory or device node is refused before
// any read); IoError when it holds more than max_bytes (checked before reading).
std::string read_file(const std::string& path, uint64_t max_bytes = UINT64_MAX);

}  // namespace hmla::io
