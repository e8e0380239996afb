// Quantized attention as a stage: every attention module call (self, joint and cross) runs
// ops::attention_forward's flash_int8, Q K^T in int8 as SageAttention and MindIE SD's quantized
// flash attention do (ops/attention.h), instead of the autotuner's exact pick. It is lossy, so it
// runs only when a request asks:
//   --quant-attention int8            (request JSON: "quant_attention": "int8")
// It computes what it replaces, so a step cache above it still replays, and under Ulysses each
// rank runs its heads in int8; sparse attention and ring attention compute attention their own
// way and do not combine with it (an error naming both).
#pragma once

#include <string>
#include <string_view>

#include "pipelines/stage.h"

namespace cubevec::pipelines {

enum class AttentionQuant { none, int8 };
// "none" or "int8"; anything else is an error naming `source` and the allowed values.
AttentionQuant parse_attention_quant(std::string_view name, const std::string& source = "--quant-attention");
std::string_view attention_quant_name(AttentionQuant quant);

// flash_int8 on BSND q, k, v (the kernel reads the strided rows: no transposed copy), as
// [B, S, heads * head_dim]: what the stage runs in place of the exact attention.
Tensor int8_attention(const models::AttentionQkv& qkv, const Stream& stream);

class QuantAttentionStage : public Stage {
 public:
  // Throws, naming the flag, where this CPU cannot run int8 attention (unless `simulate`: a
  // shape-only run prices it without running it).
  explicit QuantAttentionStage(AttentionQuant quant, bool simulate = false);
  std::string name() const override { return "quant-attention " + std::string(attention_quant_name(quant_)); }
  void begin_run(const RunInfo& run) override;
  bool uses_attention() const override { return true; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const AttendNext& next) override;
  std::string summary() const override;
  nlohmann::ordered_json report() const override;
  int quantized_calls() const { return calls_; }

 private:
  AttentionQuant quant_;
  int calls_ = 0;
};

}  // namespace cubevec::pipelines
