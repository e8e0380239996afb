// The text encoders of real diffusers folders, as their pipelines call them (TextEncoder,
// models/text_encoder.h):
//   FluxTextEncoder  FluxPipeline: text_encoder/ (CLIPTextModel) + tokenizer/ (CLIP BPE) give the
//                    pooled vector, 77 tokens padded, no mask; text_encoder_2/ (T5EncoderModel) +
//                    tokenizer_2/ (T5) give the sequence, max_sequence_length tokens padded, no mask
//                    (padding is attended to and kept).
//   WanTextEncoder   WanPipeline: the prompt cleaned (html unescape twice, whitespace collapsed),
//                    text_encoder/ (UMT5EncoderModel) + tokenizer/ (T5) with the attention mask,
//                    then every row past the prompt's tokens (and its </s>) set to zero.
// Weights stored bf16 are kept bf16 (mmap'd) whatever the run's dtype, so T5-XXL takes 9.5 GB,
// not 19 (an f32 run widens them while packing: f32 arithmetic); the encoders are freed when the
// caller drops them, before denoising.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "device/stream.h"
#include "models/clip_text_model.h"
#include "models/t5_encoder.h"
#include "models/text_encoder.h"
#include "tensor/checkpoint.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace cubevec::models {

// What one encoder folder's config.json describes: model_type, else architectures, else diffusers'
// _class_name for the shipped tiny encoder. Anything else is an Error naming the file.
enum class EncoderConfigKind { tiny, clip, t5, umt5 };
EncoderConfigKind encoder_config_kind(const std::string& config_path);

// What model_dir/text_encoder/config.json describes (a T5 there is an error: it is Flux's
// text_encoder_2).
enum class TextEncoderKind { none, tiny, clip_t5, umt5 };
TextEncoderKind text_encoder_kind(const std::string& model_dir);

// model_dir/model_index.json (when present): every text_encoder*, tokenizer* entry that is not
// null must name a class cubevec has (CLIPTextModel, T5EncoderModel, UMT5EncoderModel;
// CLIPTokenizer[Fast], T5Tokenizer[Fast], AutoTokenizer), else an Error naming the entry and class.
void check_text_component_classes(const std::string& model_dir);

// The dtype to keep an encoder's matrices in: bf16 when the run asks for it or the checkpoint
// stores them so (no f32 copy of a bf16 file), else f32.
DType encoder_weight_dtype(const std::string& encoder_dir, DType run_dtype);
DType encoder_weight_dtype(const Checkpoint& checkpoint, DType run_dtype);
// An f32 run computes in f32 whatever the checkpoint stores (as transformers' from_pretrained
// upcasts): every Linear of `table` whose weight was kept bf16 is widened exactly while packed
// (Linear::widen_bf16), with no f32 copy of the weight. A bf16 run is left alone.
void compute_in_run_dtype(const ParameterTable& table, DType run_dtype);

// What encoding one prompt of `length` tokens needs, from the folder's files alone (checked
// before anything loads): the weights at the dtype they will be kept in, twice for the matrices
// (the GEMM's packed panels), and the live activations at the widest point (for T5 the
// [heads, L, L] position bias and its scores).
struct TextEncodingMemory {
  uint64_t weights = 0, activations = 0;
  uint64_t total() const { return weights + activations; }
};
TextEncodingMemory estimate_text_encoding_memory(const std::string& encoder_dir, DType run_dtype, int64_t length);

class FluxTextEncoder : public TextEncoder {
 public:
  // max_sequence_length: T5's padded length, 1 to 512 (FluxPipeline refuses more): else an Error.
  static void check_max_sequence_length(int max_sequence_length);
  static std::unique_ptr<FluxTextEncoder> load(const std::string& model_dir, DType run_dtype, int max_sequence_length,
                                               const Stream& stream);
  std::string name() const override;
  PromptEmbeddings encode(const std::string& prompt) override { return encode_as(prompt, "--prompt"); }
  // `what` names the text in errors ("--negative-prompt").
  PromptEmbeddings encode_as(const std::string& prompt, const std::string& what);
  // T5's padded length for the next prompts (a loaded encoder serves requests of any length).
  void set_max_sequence_length(int max_sequence_length);

  const ClipTextModel& clip() const { return *clip_; }
  const T5EncoderModel& t5() const { return *t5_; }
  const tokenizers::ClipTokenizer& clip_tokenizer() const { return clip_tokenizer_; }
  const tokenizers::T5Tokenizer& t5_tokenizer() const { return *t5_tokenizer_; }

 private:
  FluxTextEncoder() = default;
  std::string source_;
  std::unique_ptr<ClipTextModel> clip_;
  std::unique_ptr<T5EncoderModel> t5_;
  tokenizers::ClipTokenizer clip_tokenizer_;
  std::optional<tokenizers::T5Tokenizer> t5_tokenizer_;  // no default constructor
  int max_sequence_length_ = 512;
};

class WanTextEncoder : public TextEncoder {
 public:
  static void check_max_sequence_length(int max_sequence_length);  // 1 to 4096, else an Error
  static std::unique_ptr<WanTextEncoder> load(const std::string& model_dir, DType run_dtype, int max_sequence_length, const Stream& stream);
  std::string name() const override;
  PromptEmbeddings encode(const std::string& prompt) override { return encode_as(prompt, "--prompt"); }
  PromptEmbeddings encode_as(const std::string& prompt, const std::string& what);
  void set_max_sequence_length(int max_sequence_length);  // umT5's padded length for the next prompts

  const T5EncoderModel& umt5() const { return *umt5_; }
  const tokenizers::T5Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  WanTextEncoder() = default;
  std::string source_;
  std::unique_ptr<T5EncoderModel> umt5_;
  std::optional<tokenizers::T5Tokenizer> tokenizer_;
  int max_sequence_length_ = 512;
};

// WanPipeline's zeroing: a copy of `hidden` [1, L, D] (f32) with the rows whose mask value is 0 set
// to zero (`hidden` itself is left as it is).
Tensor zero_padded_rows(const Tensor& hidden, const std::vector<int32_t>& attention_mask);

}  // namespace cubevec::models
