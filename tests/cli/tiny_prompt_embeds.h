// Prompt-embedding files for the tiny test models (tests/data/flux_tiny, wan_tiny), written into a
// test's scratch directory for `--prompt-embeds`: random values of the shapes each model takes,
// negatives included (for CFG runs).
#pragma once

#include <filesystem>
#include <string>

#include "common/tensor_testing.h"
#include "tensor/safetensors.h"

namespace cubevec_cli_test {

inline std::string flux_embeds(const std::filesystem::path& dir) {
  const std::string path = (dir / "flux_embeds.safetensors").string();
  cubevec::write_safetensors(path,
                             {{"prompt_embeds", cubevec::testing::random_tensor({1, 5, 40}, 1, cubevec::DType::f32, 1.0f)},
                              {"pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 2, cubevec::DType::f32, 1.0f)},
                              {"negative_prompt_embeds", cubevec::testing::random_tensor({1, 5, 40}, 3, cubevec::DType::f32, 1.0f)},
                              {"negative_pooled_prompt_embeds", cubevec::testing::random_tensor({1, 24}, 4, cubevec::DType::f32, 1.0f)}});
  return path;
}

inline std::string wan_embeds(const std::filesystem::path& dir) {
  const std::string path = (dir / "wan_embeds.safetensors").string();
  cubevec::write_safetensors(path, {{"prompt_embeds", cubevec::testing::random_tensor({1, 7, 24}, 1, cubevec::DType::f32, 1.0f)},
                                    {"negative_prompt_embeds", cubevec::testing::random_tensor({1, 7, 24}, 2, cubevec::DType::f32, 1.0f)}});
  return path;
}

}  // namespace cubevec_cli_test
