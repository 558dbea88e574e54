// The token files and the loader's position (data/token_set.h, data/loader.h): what
// load_token_set accepts as documents, and where PackedLoader::seek may put a resumed run.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "hmla/core/error.h"
#include "hmla/io/safetensors.h"
#include "hmla/data/loader.h"
#include "hmla/data/token_set.h"

namespace hmla {
namespace {

namespace fs = std::filesystem;

// doc_offsets rise strictly from 0 to the token count: an empty document (a repeated offset), a
// start past 0 or an end short of the tokens is refused.
TEST(TokenData, DocumentOffsetsRiseStrictlyFromZeroToTheTokenCount) {
  const fs::path f = fs::temp_directory_path() / ("hmla_tokens_" + std::to_string(::getpid()) + ".safetensors");
  auto load = [&](const std::vector<int64_t>& offsets) {
    io::save_safetensors(f.string(), {{"tokens", Tensor::from_vector<int32_t>({10}, std::vector<int32_t>(10, 5))},
                                      {"doc_offsets", Tensor::from_vector<int64_t>({int64_t(offsets.size())}, offsets)}});
    return load_token_set(f.string());
  };
  EXPECT_EQ(load({0, 4, 10}).docs(), 2);
  EXPECT_EQ(load({0, 1, 2, 10}).docs(), 3);  // one-token documents
  EXPECT_THROW(load({0, 4, 4, 10}), IoError);
  EXPECT_THROW(load({0, 0, 10}), IoError);
  EXPECT_THROW(load({1, 4, 10}), IoError);
  EXPECT_THROW(load({0, 4, 9}), IoError);
  EXPECT_THROW(load({0, 6, 4, 10}), IoError);
  fs::remove(f);
}

// The offset is checked against its own document by the loader (which knows the shuffle): with
// every document 10 tokens long, offsets 0..9 are positions in it and 10 is not.
TEST(TokenData, TheLoaderRefusesAnOffsetPastItsDocument) {
  const TokenSet train{std::vector<int32_t>(30, 5), {0, 10, 20, 30}};
  PackedLoader loader(train, 8, 1);
  EXPECT_NO_THROW(loader.seek({0, 1, 9}));
  EXPECT_NO_THROW(loader.seek({0, 3, 0}));  // the epoch's end
  EXPECT_THROW(loader.seek({0, 1, 10}), IoError);
  EXPECT_THROW(loader.seek({0, 4, 0}), IoError);
}

}  // namespace
}  // namespace hmla
