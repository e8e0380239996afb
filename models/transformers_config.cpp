#include "models/transformers_config.h"

#include <algorithm>

#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::models {

namespace {

std::string joined(std::initializer_list<std::string_view> names) {
  std::string out;
  for (std::string_view n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

void expect_transformers_architecture(ConfigReader& reader, std::initializer_list<std::string_view> architectures,
                                      std::initializer_list<std::string_view> model_types) {
  if (reader.has("architectures")) {
    std::vector<std::string> listed;
    reader.texts("architectures", listed);
    const bool known = std::any_of(listed.begin(), listed.end(), [&](const std::string& a) {
      return std::find(architectures.begin(), architectures.end(), a) != architectures.end();
    });
    if (!known) {
      std::string said;
      for (const std::string& a : listed) said += (said.empty() ? "" : ", ") + a;
      reader.fail("architectures", "[" + said + "] is not an architecture cubevec runs here (expected " + joined(architectures) + ")");
    }
  }
  if (reader.has("model_type")) {
    std::string type;
    reader.text("model_type", type);
    if (std::find(model_types.begin(), model_types.end(), type) == model_types.end())
      reader.fail("model_type", "'" + type + "' is not a model type cubevec runs here (expected " + joined(model_types) + ")");
  }
}

Tensor embedding_rows(const Tensor& table, const std::vector<int32_t>& ids, const std::string& what) {
  const int64_t vocab = table.size(0), width = table.size(1);
  std::vector<float> rows(ids.size() * static_cast<std::size_t>(width));
  const bool bf16 = table.dtype() == DType::bf16;
  const void* base = table.data_ptr();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab)
      throw Error(what + ": token id " + std::to_string(id) + " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
    float* dst = rows.data() + i * static_cast<std::size_t>(width);
    if (bf16) {
      convert_bf16_to_f32(static_cast<const uint16_t*>(base) + id * width, dst, static_cast<std::size_t>(width));
    } else {
      const float* src = static_cast<const float*>(base) + id * width;
      std::copy(src, src + width, dst);
    }
  }
  return Tensor::from_vector(rows, {1, static_cast<int64_t>(ids.size()), width});
}

}  // namespace cubevec::models
