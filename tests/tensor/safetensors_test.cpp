// Writing and reading safetensors: round trips of every dtype, zero-copy views, layout of the
// written file, and the errors for names and dtypes cubevec cannot serve.
#include "tensor/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/tensor_testing.h"

namespace cubevec {
namespace safetensors_test {  // named after the file: unity batches never mix two files' helpers

using testing::message_of;

std::string temp_path(const std::string& name) { return (std::filesystem::temp_directory_path() / ("cubevec_st_" + name)).string(); }

// A tensor of `dtype` whose bytes are a pattern that depends on `seed`.
Tensor patterned(const Shape& shape, DType dtype, int seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.mutable_data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(i * 31 + seed * 7 + 3);
  if (dtype == DType::boolean)
    for (std::size_t i = 0; i < t.nbytes(); ++i) bytes[i] &= 1;
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

TEST(Safetensors, RoundTripEveryDtype) {
  NamedTensors tensors;
  int seed = 0;
  for (DType dtype : kAllDTypes) tensors.emplace_back("t_" + std::string(dtype_name(dtype)), patterned({3, 5}, dtype, ++seed));
  tensors.emplace_back("scalar", patterned({}, DType::f32, 99));
  tensors.emplace_back("empty", Tensor::empty({0, 4}, DType::bf16));
  const std::string path = temp_path("roundtrip.safetensors");
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "cubevec test"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "cubevec test");
  EXPECT_EQ(file.entries().size(), tensors.size());
  for (const auto& [name, original] : tensors) {
    const Tensor loaded = file.tensor(name);
    EXPECT_EQ(loaded.dtype(), original.dtype()) << name;
    EXPECT_EQ(loaded.shape(), original.shape()) << name;
    EXPECT_TRUE(same_bytes(loaded, original)) << name;
  }
  std::remove(path.c_str());
}

TEST(Safetensors, WritesNonContiguousTensorsInLogicalOrder) {
  const Tensor base = patterned({4, 6}, DType::f32, 1);
  const Tensor view = base.transpose(0, 1).narrow(0, 1, 3);  // [3, 4], strided
  const std::string path = temp_path("strided.safetensors");
  write_safetensors(path, {{"v", view}});
  const Tensor loaded = SafetensorsFile::open(path).tensor("v");
  ASSERT_EQ(loaded.shape(), (Shape{3, 4}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(loaded.at<float>({i, j}), base.at<float>({j, i + 1}));
  std::remove(path.c_str());
}

TEST(Safetensors, ReadsAreZeroCopyAndReadOnly) {
  const std::string path = temp_path("zerocopy.safetensors");
  write_safetensors(path, {{"a", patterned({8, 8}, DType::f32, 1)}, {"b", patterned({16}, DType::bf16, 2)}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  Tensor a = file.tensor("a");
  EXPECT_TRUE(a.storage()->read_only()) << "a view of the mapping, not a copy";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data_ptr()) % 4, 0u);
  EXPECT_NE(message_of([&] { a.mutable_data<float>(); }).find("read-only"), std::string::npos);
  std::remove(path.c_str());  // the mapping keeps the bytes alive after the file is unlinked
  EXPECT_TRUE(same_bytes(a, patterned({8, 8}, DType::f32, 1)));
}

TEST(Safetensors, WriterUsesTheCanonicalLayout) {
  const std::string path = temp_path("layout.safetensors");
  write_safetensors(path, {{"z_small", patterned({3}, DType::u8, 1)},
                           {"b_big", patterned({2}, DType::i64, 2)},
                           {"a_big", patterned({2}, DType::i64, 3)},
                           {"half", patterned({5}, DType::f16, 4)},
                           {"i_32", patterned({1}, DType::i32, 5)},
                           {"f_32", patterned({1}, DType::f32, 6)},
                           {"bf", patterned({1}, DType::bf16, 7)}});
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const auto json = nlohmann::json::parse(header);  // trailing spaces are JSON whitespace
  EXPECT_EQ(json["a_big"]["data_offsets"], nlohmann::json::array({0, 16}));
  EXPECT_EQ(json["b_big"]["data_offsets"], nlohmann::json::array({16, 32}));
  // Same-size dtypes follow the format's rank, not the name: F32 > I32, BF16 > F16.
  EXPECT_EQ(json["f_32"]["data_offsets"], nlohmann::json::array({32, 36}));
  EXPECT_EQ(json["i_32"]["data_offsets"], nlohmann::json::array({36, 40}));
  EXPECT_EQ(json["bf"]["data_offsets"], nlohmann::json::array({40, 42}));
  EXPECT_EQ(json["half"]["data_offsets"], nlohmann::json::array({42, 52}));
  EXPECT_EQ(json["z_small"]["data_offsets"], nlohmann::json::array({52, 55}));
  EXPECT_EQ(json["half"]["dtype"], "F16");
  std::remove(path.c_str());
}

TEST(Safetensors, UnalignedTensorsAreCopiedToAlignedMemory) {
  // Another writer may put an F32 tensor at an odd offset; kernels still get aligned data.
  const std::string json = R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  const float values[2] = {1.5f, -2.25f};
  bytes += json + "\x07" + std::string(reinterpret_cast<const char*>(values), 8);
  const std::string path = temp_path("unaligned.safetensors");
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const Tensor f = SafetensorsFile::open(path).tensor("f");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(f.data_ptr()) % 4, 0u);
  EXPECT_EQ(f.at<float>({0}), 1.5f);
  EXPECT_EQ(f.at<float>({1}), -2.25f);
  std::remove(path.c_str());
}

TEST(Safetensors, ClearErrorsForNamesAndDtypes) {
  const std::string json = R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(json.size());
  bytes += json + std::string(8, '\0');
  const std::string path = temp_path("f64.safetensors");
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_NE(message_of([&] { file.tensor("d"); }).find(path + ": tensor 'd' has dtype F64, which cubevec does not support"),
            std::string::npos);
  EXPECT_NE(message_of([&] { file.tensor("missing"); }).find(path + ": no tensor named 'missing'"), std::string::npos);
  EXPECT_NE(message_of([] {
              SafetensorsFile::open("/nonexistent/cubevec.safetensors");
            }).find("/nonexistent/cubevec.safetensors: cannot open: No such file or directory"),
            std::string::npos);
  std::remove(path.c_str());
}

TEST(Safetensors, WriterRejectsBadInput) {
  const std::string path = temp_path("bad_write.safetensors");
  const Tensor t = patterned({2}, DType::f32, 1);
  EXPECT_NE(message_of([&] { write_safetensors(path, {{"x", t}, {"x", t}}); }).find("'x' given twice"), std::string::npos);
  EXPECT_NE(message_of([&] { write_safetensors(path, {{"__metadata__", t}}); }).find("reserved"), std::string::npos);
  EXPECT_NE(message_of([&] {
              write_safetensors(path, {{"m", Tensor::meta({2}, DType::f32)}});
            }).find("no data to write"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              write_safetensors("/nonexistent/dir/x.safetensors", {{"x", t}});
            }).find("the directory /nonexistent/dir does not exist"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace safetensors_test
}  // namespace cubevec
