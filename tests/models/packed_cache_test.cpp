// The packed cache (models/packed_cache.h): a file written once, then mapped by a fresh model with
// no packing, giving bit for bit the products of panels packed in memory (and, against a plain
// loop, the right ones); stale or foreign files are ignored with a note and replaced; damaged ones
// (truncated, flipped bytes, a bad magic or header, a FIFO) are errors naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "base/content_hash.h"
#include "models/layers.h"
#include "models/packed_cache.h"
#include "ops/gemm/driver.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace packed_cache_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
namespace g = ops::gemm;

// Four Linears: partial panels, several K blocks, f32 and bf16 weights, two of one shape.
struct SmallModel {
  models::ParameterTable table;
  std::vector<std::unique_ptr<models::Linear>> layers;

  explicit SmallModel(unsigned seed = 7) {
    const struct {
      const char* name;
      int64_t in, out;
      DType dtype;
    } specs[] = {{"proj_in", 70, 37, DType::f32},
                 {"proj_in_2", 70, 37, DType::f32},
                 {"blocks.0.ff", 1100, 64, DType::bf16},
                 {"proj_out", 33, 19, DType::bf16}};
    for (const auto& s : specs) {
      auto l = std::make_unique<models::Linear>();
      l->declare(table, s.name, s.in, s.out, true);
      l->weight = random_tensor({s.out, s.in}, seed++, s.dtype);
      l->bias = random_tensor({s.out}, seed++);
      layers.push_back(std::move(l));
    }
  }
  models::PackedCacheModel cache_model() const { return {"small", "small model", {{"transformer", &table}}, 1}; }
  // Every layer's product on a fixed input.
  std::vector<std::vector<double>> outputs() const {
    std::vector<std::vector<double>> out;
    for (const auto& l : layers) out.push_back(values((*l)(random_tensor({5, l->in}, 99), ops::default_op_stream())));
    return out;
  }
};

// y = x W^T + b in double, on the weight's stored values (bf16 products: the inputs rounded to bf16).
std::vector<double> plain_linear(const models::Linear& l) {
  // The same input as outputs(), rounded to bf16 as the GEMM rounds it for a bf16 weight.
  const Tensor x = random_tensor({5, l.in}, 99, l.weight.dtype() == DType::bf16 ? DType::bf16 : DType::f32);
  const std::vector<double> xs = values(x), ws = values(l.weight), bs = values(l.bias);
  std::vector<double> y(static_cast<std::size_t>(5 * l.out));  // [5, out]
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < l.out; ++j) {
      double s = bs[static_cast<std::size_t>(j)];
      for (int64_t k = 0; k < l.in; ++k) s += xs[static_cast<std::size_t>(i * l.in + k)] * ws[static_cast<std::size_t>(j * l.in + k)];
      y[static_cast<std::size_t>(i * l.out + j)] = s;
    }
  return y;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}
// Overwrites the file in place (the cache keeps it read-only; tests damage it on purpose).
void put_bytes(const std::string& path, const std::string& bytes) {
  std::error_code ignored;
  std::filesystem::permissions(path, std::filesystem::perms::owner_write, std::filesystem::perm_options::add, ignored);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(PackedCache, SecondModelMapsTheFileWithoutPackingAndComputesTheSame) {
  TempDir dir;
  const std::vector<std::vector<double>> in_memory = SmallModel().outputs();  // panels packed in memory
  SmallModel first;
  const models::PackedCacheResult written = models::use_packed_cache(dir.path.string(), first.cache_model());
  EXPECT_EQ(written.state, "written");
  EXPECT_EQ(written.layers, 4);
  EXPECT_EQ(written.packed, 4u);
  EXPECT_TRUE(written.ignored.empty());
  EXPECT_EQ(written.file, models::packed_cache_path(dir.path.string(), first.cache_model()));
  const auto perms = std::filesystem::status(written.file).permissions();
  EXPECT_EQ(perms & std::filesystem::perms::owner_write, std::filesystem::perms::none) << "kept read-only: replaced, never overwritten";
  EXPECT_EQ(first.outputs(), in_memory);

  SmallModel second;
  const uint64_t packed_before = g::packed_b_count();
  const models::PackedCacheResult mapped = models::use_packed_cache(dir.path.string(), second.cache_model());
  EXPECT_EQ(mapped.state, "mapped");
  EXPECT_EQ(mapped.packed, 0u);
  EXPECT_EQ(mapped.bytes, written.bytes);
  EXPECT_EQ(second.outputs(), in_memory);
  EXPECT_EQ(g::packed_b_count(), packed_before) << "running the mapped layers packed nothing";
  for (std::size_t i = 0; i < second.layers.size(); ++i) {
    const models::Linear& l = *second.layers[i];
    const Tensor y = l(random_tensor({5, l.in}, 99), ops::default_op_stream());
    const std::vector<double> want = plain_linear(l);
    expect_close_rel(y, Tensor::from_vector(std::vector<float>(want.begin(), want.end()), {5, l.out}), 1e-5, l.name);
  }
}

TEST(PackedCache, OtherWeightsAreIgnoredWithANoteAndTheFileReplaced) {
  TempDir dir;
  SmallModel first;
  models::use_packed_cache(dir.path.string(), first.cache_model());
  SmallModel changed;
  changed.layers[2]->weight = random_tensor({64, 1100}, 1234, DType::bf16);
  const auto want = [&] {
    SmallModel twin;
    twin.layers[2]->weight = changed.layers[2]->weight;
    return twin.outputs();
  }();
  const models::PackedCacheResult r = models::use_packed_cache(dir.path.string(), changed.cache_model());
  EXPECT_EQ(r.state, "written");
  EXPECT_NE(r.ignored.find("other weights (transformer/blocks.0.ff changed"), std::string::npos) << r.ignored;
  EXPECT_EQ(changed.outputs(), want);
  SmallModel again;  // the original weights: the replaced file is now the stale one
  again.layers[2]->weight = changed.layers[2]->weight;
  EXPECT_EQ(models::use_packed_cache(dir.path.string(), again.cache_model()).state, "mapped");
}

// Replaces `from` by `to` (the same length) in the file's header.
void patch_header(const std::string& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = file_bytes(path);
  const std::size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  bytes.replace(at, from.size(), to);
  put_bytes(path, bytes);
}

TEST(PackedCache, AFileForAnotherCpuOrOtherKernelsIsIgnoredAndRewritten) {
  TempDir dir;
  SmallModel model;
  const std::string path = models::use_packed_cache(dir.path.string(), model.cache_model()).file;
  const std::string cpu = g::cpu_model_name();
  ASSERT_FALSE(cpu.empty());
  patch_header(path, "\"cpu\":\"" + cpu, "\"cpu\":\"" + std::string(cpu.size(), 'X'));
  SmallModel second;
  models::PackedCacheResult r = models::use_packed_cache(dir.path.string(), second.cache_model());
  EXPECT_EQ(r.state, "written");
  EXPECT_NE(r.ignored.find("another CPU (" + std::string(cpu.size(), 'X')), std::string::npos) << r.ignored;
  EXPECT_NE(file_bytes(path).find("\"cpu\":\"" + cpu), std::string::npos) << "rewritten for this CPU";

  // Other kernel choices: proj_in's panels as a kernel with half the KC would lay them out (a
  // consistent layout, not this CPU's choice).
  {
    std::string bytes = file_bytes(path);
    uint64_t header_size = 0;
    std::memcpy(&header_size, bytes.data() + 8, sizeof header_size);
    nlohmann::ordered_json header = nlohmann::ordered_json::parse(bytes.substr(16, header_size));
    for (auto& layer : header["layers"])
      if (layer["layer"] == "transformer/proj_in") {
        ASSERT_GE(layer["kc"].get<int64_t>() / 2, 70);
        for (const char* key : {"kc", "panel_stride", "bytes"}) layer[key] = layer[key].get<int64_t>() / 2;
      }
    const std::string text = header.dump();
    ASSERT_LE(text.size(), header_size);
    header_size = text.size();
    std::memcpy(bytes.data() + 8, &header_size, sizeof header_size);
    bytes.replace(16, text.size(), text);
    bytes[16 + text.size()] = '\0';  // the rest of the old header: zeros, as the writer pads
    std::fill(bytes.begin() + 16 + static_cast<std::ptrdiff_t>(text.size()), bytes.begin() + 4096, '\0');
    put_bytes(path, bytes);
  }
  SmallModel third;
  r = models::use_packed_cache(dir.path.string(), third.cache_model());
  EXPECT_EQ(r.state, "written");
  EXPECT_NE(r.ignored.find("other kernel choices (transformer/proj_in: f32 panels (KC"), std::string::npos) << r.ignored;
  EXPECT_EQ(third.outputs(), SmallModel().outputs());

  // A file of another format version (a newer cubevec's) is replaced, not called damaged.
  patch_header(path, "\"version\":1,", "\"version\":7,");
  SmallModel fourth;
  r = models::use_packed_cache(dir.path.string(), fourth.cache_model());
  EXPECT_EQ(r.state, "written");
  EXPECT_NE(r.ignored.find("another version of cubevec (format version 7; this one reads 1)"), std::string::npos) << r.ignored;
}

TEST(PackedCache, ADamagedFileIsAnErrorNamingItAndIsNotMapped) {
  TempDir dir;
  SmallModel model;
  const std::string path = models::use_packed_cache(dir.path.string(), model.cache_model()).file;
  const std::string good = file_bytes(path);
  const auto error_for = [&](const std::string& bytes) {
    put_bytes(path, bytes);
    SmallModel fresh;
    return message_of([&] { models::use_packed_cache(dir.path.string(), fresh.cache_model()); });
  };
  const std::string truncated = error_for(good.substr(0, good.size() - 100));
  EXPECT_NE(truncated.find(path), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("run past the file's end"), std::string::npos) << truncated;

  std::string flipped = good;
  flipped[flipped.size() - 7] = static_cast<char>(flipped[flipped.size() - 7] ^ 0x10);  // inside proj_out's panels
  const std::string hash = error_for(flipped);
  EXPECT_NE(hash.find("the panels of transformer/proj_out do not match their recorded hash"), std::string::npos) << hash;

  EXPECT_NE(error_for("NOTCVPACK and more bytes").find("magic"), std::string::npos);
  EXPECT_NE(error_for("").find("magic"), std::string::npos);
  std::string huge_header = good;
  const uint64_t length = uint64_t{1} << 40;
  std::memcpy(huge_header.data() + 8, &length, sizeof length);
  EXPECT_NE(error_for(huge_header).find("header length"), std::string::npos);
  std::string bad_json = good;
  bad_json[16] = '[';
  bad_json[17] = '[';
  EXPECT_NE(error_for(bad_json).find("is damaged"), std::string::npos);
  std::string overlapping = good;
  const std::size_t offset_at = overlapping.find("\"offset\":4096");
  ASSERT_NE(offset_at, std::string::npos);
  overlapping.replace(offset_at, 13, "\"offset\":  16");  // inside the header
  EXPECT_NE(error_for(overlapping).find("page-aligned place after the previous data"), std::string::npos);

  // Header fields must be what the writer writes: integers, in range, known names.
  const auto with_header_edit = [&](const std::string& from, const std::string& to) {
    uint64_t header_size = 0;
    std::memcpy(&header_size, good.data() + 8, sizeof header_size);
    std::string header = good.substr(16, header_size);
    const std::size_t at = header.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    header.replace(at, from.size(), to);
    // The header may grow into its zero padding: the panels' offsets stay where they were.
    std::string bytes = good;
    header_size = header.size();
    std::memcpy(bytes.data() + 8, &header_size, sizeof header_size);
    bytes.replace(16, header.size(), header);
    return error_for(bytes);
  };
  EXPECT_NE(with_header_edit("\"n\":37,", "\"n\":3.5,").find("\"n\" is 3.5 (expected an integer"), std::string::npos);
  EXPECT_NE(with_header_edit("\"n\":37,", "\"n\":-1,").find("\"n\" is -1 (expected an integer in 1.."), std::string::npos);
  EXPECT_NE(with_header_edit("\"version\":1,", "\"version\":1.0,").find("\"version\" is 1.0"), std::string::npos);
  EXPECT_NE(with_header_edit("\"threads\":1,", "\"threads\":0,").find("\"threads\" is 0"), std::string::npos);
  EXPECT_NE(with_header_edit("\"compute\":\"f32\"", "\"compute\":\"f64\"").find("is not f32 or bf16"), std::string::npos);
  // A layout no kernel makes (its bytes do not fill whole K blocks of its panel stride).
  EXPECT_NE(with_header_edit("\"panel_stride\":", "\"panel_stride\":1").find("layout is impossible"), std::string::npos);
  // A header length that takes in the padding's zeros.
  std::string longer = good;
  uint64_t header_length = 0;
  std::memcpy(&header_length, longer.data() + 8, sizeof header_length);
  ++header_length;
  std::memcpy(longer.data() + 8, &header_length, sizeof header_length);
  EXPECT_NE(error_for(longer).find("holds a NUL byte"), std::string::npos);

  // Panels moved to another layer of the same shape, with their recorded hash, do not pass.
  {
    std::string swapped = good;
    const auto record_of = [&](const std::string& layer) {
      const std::size_t at = swapped.find("\"layer\":\"transformer/" + layer + "\"");
      const auto number = [&](const char* key) {
        const std::size_t p = swapped.find(key, at) + std::strlen(key);
        return std::stoull(swapped.substr(p, 20));
      };
      const std::size_t hash_at = swapped.find("\"panel_hash\":\"", at) + 14;
      return std::make_tuple(number("\"offset\":"), number("\"bytes\":"), hash_at);
    };
    const auto [offset_a, bytes_a, hash_a] = record_of("proj_in");
    const auto [offset_b, bytes_b, hash_b] = record_of("proj_in_2");
    ASSERT_EQ(bytes_a, bytes_b);
    std::string data_a = swapped.substr(offset_a, bytes_a), text_a = swapped.substr(hash_a, 16);
    swapped.replace(offset_a, bytes_a, swapped.substr(offset_b, bytes_b));
    swapped.replace(offset_b, bytes_b, data_a);
    swapped.replace(hash_a, 16, swapped.substr(hash_b, 16));
    swapped.replace(hash_b, 16, text_a);
    EXPECT_NE(error_for(swapped).find("do not match their recorded hash"), std::string::npos);
  }

  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  SmallModel fresh;
  const std::string fifo = message_of([&] { models::use_packed_cache(dir.path.string(), fresh.cache_model()); });
  EXPECT_NE(fifo.find("not a regular file"), std::string::npos) << fifo;
  EXPECT_EQ(fresh.outputs(), SmallModel().outputs()) << "nothing was adopted";
}

TEST(PackedCache, TheFolderIsCreatedWhenMissingAndAFileInItsPlaceIsAnError) {
  TempDir dir;
  SmallModel model;
  const std::string inner = (dir.path / "packed").string();
  EXPECT_EQ(models::use_packed_cache(inner, model.cache_model()).state, "written");
  EXPECT_TRUE(std::filesystem::is_directory(inner));
  const std::string file = dir.write("plain", "x");
  SmallModel other;
  const std::string message = message_of([&] { models::use_packed_cache(file, other.cache_model()); });
  EXPECT_NE(message.find(file + " is not a folder"), std::string::npos) << message;
  const std::string missing = message_of([&] { models::use_packed_cache((dir.path / "a" / "b").string(), other.cache_model()); });
  EXPECT_NE(missing.find("cannot be created"), std::string::npos) << missing;
}

TEST(PackedCache, AdoptingPanelsOfAnotherLayoutOrAlignmentIsRefused) {
  const g::PackedLayout layout = g::packed_layout(37, 70, g::Element::f32, g::best_isa(), 1);
  alignas(64) static float panels[1 << 16];
  ASSERT_LE(layout.bytes, sizeof panels);
  EXPECT_NO_THROW(g::adopt_packed_b(37, 70, g::Element::f32, g::best_isa(), layout, panels, nullptr));
  g::PackedLayout other = layout;
  other.kc += 1;
  EXPECT_NE(message_of([&] { g::adopt_packed_b(37, 70, g::Element::f32, g::best_isa(), other, panels, nullptr); }).find("another kernel"),
            std::string::npos);
  EXPECT_NE(message_of([&] { g::adopt_packed_b(37, 70, g::Element::f32, g::best_isa(), layout, panels + 1, nullptr); }).find("aligned"),
            std::string::npos);
}

TEST(ContentHash, EveryBitAndTheLengthMatterAndAlignmentDoesNot) {
  std::vector<unsigned char> bytes(301);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  const uint64_t base = content_hash(bytes.data(), bytes.size());
  EXPECT_EQ(base, content_hash(bytes.data(), bytes.size()));
  std::set<uint64_t> seen{base};
  for (std::size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      bytes[i] ^= static_cast<unsigned char>(1 << bit);
      seen.insert(content_hash(bytes.data(), bytes.size()));
      bytes[i] ^= static_cast<unsigned char>(1 << bit);
    }
  EXPECT_EQ(seen.size(), 1 + bytes.size() * 8) << "every single-bit change gives a hash of its own";
  EXPECT_NE(content_hash(bytes.data(), 300), base);
  EXPECT_NE(content_hash(bytes.data(), bytes.size(), 1), base);
  std::vector<unsigned char> shifted(bytes.size() + 3);
  std::memcpy(shifted.data() + 3, bytes.data(), bytes.size());
  EXPECT_EQ(content_hash(shifted.data() + 3, bytes.size()), base);
  EXPECT_EQ(hash_hex(0x0123456789abcdefull), "0123456789abcdef");
}

}  // namespace packed_cache_test
}  // namespace cubevec
