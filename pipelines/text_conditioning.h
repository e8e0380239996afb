// Where a generation's text conditioning comes from: a prompt_embeds file, the model folder's own
// text encoders (CLIP + T5 for Flux, umT5 for Wan, or the shipped tiny models' encoder), or, in
// simulate mode, shape-only embeddings of the real encoders' sizes.
//
// TextEncoders holds a folder's encoders loaded once (the library's pipeline keeps them for every
// request); flux_text / wan_text are the one-shot form the command line uses: they load the
// encoders only when the prompt needs them and free them on return, before the transformer loads,
// so the process never holds both.
//
// The messages name the command line's flags (--prompt, --negative-prompt, ...); the request's JSON
// front ends translate them to its keys (pipelines/request.h).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "device/stream.h"
#include "models/flux_transformer.h"
#include "models/text_encoder.h"
#include "models/wan_transformer.h"

namespace cubevec::models {
class FluxTextEncoder;
class WanTextEncoder;
class TinyTextEncoder;
}  // namespace cubevec::models

namespace cubevec::pipelines {

// The text half of a request.
struct PromptRequest {
  std::string prompt, negative_prompt, prompt_embeds;
  int max_sequence_length = 512;           // T5 / umT5 tokens
  bool max_sequence_length_given = false;  // asked for (a note when it cannot apply)
};

// How the encoders load: set once per pipeline.
struct TextSettings {
  DType dtype = DType::f32;    // the run's dtype: encoders stored f32 run in it
  bool check_weights = false;  // every encoder weight must be finite
  std::string memory_limit;    // text encoding must fit it as well ("24G"; empty: the memory available)
};

struct TextConditioning {
  models::PromptEmbeddings positive;
  std::optional<models::PromptEmbeddings> negative;  // set when `cfg` asked for it
  std::string source;                                // for the report: "embeddings from FILE", ...
};

// What the transformer takes as text: its sequence width, its pooled width (0: none, Wan).
struct TextInput {
  enum class Family { flux, wan } family = Family::flux;
  int64_t sequence_width = 0, pooled_width = 0;
  static TextInput of(const models::FluxConfig& config);
  static TextInput of(const models::WanConfig& config);
};

// A model folder's text encoders, loaded once. A folder without text_encoder/ loads with none (its
// requests need prompt_embeds). Encoding runs on the stream given at load, one request at a time.
class TextEncoders {
 public:
  // Loads the encoders the folder has for `input`'s family (checking their memory against the
  // settings' limit and their widths against the transformer's), at `max_sequence_length`.
  static std::unique_ptr<TextEncoders> load(const std::string& model_dir, const TextInput& input, const TextSettings& settings,
                                            int max_sequence_length, const Stream& stream);
  ~TextEncoders();

  // The request's conditioning: its prompt_embeds file, or its prompt (and, with `cfg`, its
  // negative prompt) through the encoders.
  TextConditioning encode(const PromptRequest& request, bool cfg);
  bool has_encoder() const { return flux_ || wan_ || tiny_; }

 private:
  TextEncoders() = default;
  std::string dir_;
  TextInput input_;
  std::unique_ptr<models::FluxTextEncoder> flux_;
  std::unique_ptr<models::WanTextEncoder> wan_;
  std::unique_ptr<models::TinyTextEncoder> tiny_;
};

// The one-shot forms: prompt_embeds, shape-only embeddings when `simulate`, else the folder's
// encoders loaded for this one request and freed on return. `cfg`: a negative is needed (an error
// otherwise).
TextConditioning flux_text(const std::string& model_dir, const PromptRequest& request, const TextSettings& settings, bool cfg,
                           bool simulate, const models::FluxConfig& config, const Stream& stream);
TextConditioning wan_text(const std::string& model_dir, const PromptRequest& request, const TextSettings& settings, bool cfg, bool simulate,
                          const models::WanConfig& config, const Stream& stream);

}  // namespace cubevec::pipelines
