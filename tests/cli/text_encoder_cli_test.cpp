// Real-format text encoders through the CLI (issue 16): Flux and Wan folders assembled from the
// tiny checkpoints (tests/data/flux_tiny, wan_tiny) and the tiny transformers-format encoders
// (tests/data/text_encoders, with CLIP's real vocabulary and the test SentencePiece model).
//   - encode-prompt gives the tokenizer's ids and the encoder's outputs: against the torch goldens
//     (tests/reference/make_text_encoder_goldens.py) for "a photo of a cat"; Wan's prompt_embeds
//     are last_hidden_state with the padded rows zeroed.
//   - t2i --prompt gives the same picture as t2i --prompt-embeds fed encode-prompt's outputs, and
//     t2v --prompt the same video as its embeddings: the pipelines call the encoders as
//     FluxPipeline and WanPipeline do.
//   - errors: an unknown encoder or tokenizer class in model_index.json, a missing tokenizer_2/,
//     a CLIP folder asked for Wan, a bad --encoder, a Flux --max-sequence-length above 512.
// Tolerance: CLIP's checkpoint is stored bf16 and runs so; its outputs are within 3e-2 of the
// golden's scale (the activations entering each GEMM are rounded to bf16).
#include <filesystem>
#include <fstream>
#include <limits>

#include "cli/run_cubevec.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace text_encoder_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using TextEncoderCli = cubevec_cli_test::CliTest;
using cubevec::Tensor;
using cubevec_cli_test::read_file;

const std::string kDataDir = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/";

fs::path flux_folder(const fs::path& dir) {
  const fs::path f = dir / "flux";
  fs::create_directories(f);
  for (const char* part : {"transformer", "vae", "scheduler"})
    fs::copy(kDataDir + "flux_tiny/" + part, f / part, fs::copy_options::recursive);
  fs::copy(kDataDir + "text_encoders/clip", f / "text_encoder", fs::copy_options::recursive);
  fs::copy(kDataDir + "clip_tokenizer", f / "tokenizer", fs::copy_options::recursive);
  fs::copy(kDataDir + "text_encoders/t5", f / "text_encoder_2", fs::copy_options::recursive);
  fs::copy(kDataDir + "t5_tokenizer", f / "tokenizer_2", fs::copy_options::recursive);
  return f;
}

fs::path wan_folder(const fs::path& dir) {
  const fs::path w = dir / "wan";
  fs::create_directories(w);
  for (const char* part : {"transformer", "vae", "scheduler"})
    fs::copy(kDataDir + "wan_tiny/" + part, w / part, fs::copy_options::recursive);
  fs::copy(kDataDir + "text_encoders/umt5", w / "text_encoder", fs::copy_options::recursive);
  fs::copy(kDataDir + "t5_tokenizer", w / "tokenizer", fs::copy_options::recursive);
  return w;
}

// Any tensor's values as double (integer ids and masks too).
std::vector<double> values_of(const cubevec::SafetensorsFile& f, const std::string& name) {
  const Tensor t = f.tensor(name);
  std::vector<double> out;
  if (t.dtype() == cubevec::DType::i64) {
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<double>(t.data<int64_t>()[i]));
  } else if (t.dtype() == cubevec::DType::i32) {
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data<int32_t>()[i]);
  } else {
    out = cubevec::testing::values(t);
  }
  return out;
}

TEST_F(TextEncoderCli, EncodePromptMatchesTheGoldensAndWansZeroing) {
  const fs::path flux = flux_folder(dir_);
  const std::string out = (dir_ / "clip.safetensors").string();
  const auto run_clip = run({"encode-prompt", "--model", flux.string(), "--prompt", "a photo of a cat", "--out", out});
  ASSERT_EQ(run_clip.status, 0) << run_clip.err;
  const cubevec::SafetensorsFile got = cubevec::SafetensorsFile::open(out);
  const cubevec::SafetensorsFile goldens = cubevec::SafetensorsFile::open(kDataDir + "text_encoders/goldens.safetensors");
  EXPECT_EQ(values_of(got, "input_ids_0"), values_of(goldens, "clip_cat.input_ids"));
  for (const auto& [mine, theirs] :
       {std::pair{"last_hidden_state_0", "clip_cat.last_hidden_state"}, {"pooler_output_0", "clip_cat.pooler_output"}}) {
    const auto a = values_of(got, mine), b = values_of(goldens, theirs);
    ASSERT_EQ(a.size(), b.size()) << mine;
    double scale = 0, worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::fabs(b[i])), worst = std::max(worst, std::fabs(a[i] - b[i]));
    EXPECT_LE(worst, 3e-2 * scale) << mine;
  }

  const fs::path wan = wan_folder(dir_);
  const std::string wan_out = (dir_ / "wan.safetensors").string();
  const auto run_wan = run({"encode-prompt", "--model", wan.string(), "--prompt", "a  &amp; cat", "--prompt", "", "--pipeline", "wan",
                            "--max-length", "24", "--out", wan_out});
  ASSERT_EQ(run_wan.status, 0) << run_wan.err;
  const cubevec::SafetensorsFile w = cubevec::SafetensorsFile::open(wan_out);
  for (const std::string n : {"0", "1"}) {
    const auto mask = values_of(w, "attention_mask_" + n), hidden = values_of(w, "last_hidden_state_" + n),
               embeds = values_of(w, "prompt_embeds_" + n);
    ASSERT_EQ(mask.size(), 24u);
    ASSERT_EQ(hidden.size(), 24u * 24u);
    EXPECT_EQ(w.tensor("input_ids_" + n).dtype(), cubevec::DType::i64);
    int tokens = 0;
    double padded_hidden = 0;  // last_hidden_state keeps its padded rows (only prompt_embeds zeroes them)
    for (std::size_t r = 0; r < 24; ++r) {
      tokens += mask[r] != 0;
      for (std::size_t c = 0; c < 24 && mask[r] == 0; ++c) padded_hidden += std::fabs(hidden[r * 24 + c]);
      for (std::size_t c = 0; c < 24; ++c) EXPECT_EQ(embeds[r * 24 + c], mask[r] != 0 ? hidden[r * 24 + c] : 0.0) << n << " row " << r;
    }
    EXPECT_GE(tokens, 1);  // at least </s>
    EXPECT_GT(padded_hidden, 0.0) << n << ": last_hidden_state's padded rows were zeroed";
  }
  EXPECT_EQ(values_of(w, "attention_mask_1")[0], 1.0);  // "" is [</s>, pad...]
  EXPECT_EQ(values_of(w, "attention_mask_1")[1], 0.0);
}

TEST_F(TextEncoderCli, T2iPromptEqualsItsOwnEmbeddingsFromEncodePrompt) {
  const fs::path flux = flux_folder(dir_);
  const std::string clip = (dir_ / "clip.safetensors").string(), t5 = (dir_ / "t5.safetensors").string();
  ASSERT_EQ(run({"encode-prompt", "--model", flux.string(), "--prompt", "red circle", "--out", clip}).status, 0);
  const auto t5_run = run({"encode-prompt", "--model", flux.string(), "--encoder", "text_encoder_2", "--pipeline", "flux", "--prompt",
                           "red circle", "--max-length", "32", "--out", t5});
  ASSERT_EQ(t5_run.status, 0) << t5_run.err;
  const std::string embeds = (dir_ / "embeds.safetensors").string();
  cubevec::write_safetensors(embeds, {{"prompt_embeds", cubevec::SafetensorsFile::open(t5).tensor("last_hidden_state_0")},
                                      {"pooled_prompt_embeds", cubevec::SafetensorsFile::open(clip).tensor("pooler_output_0")}});
  const std::vector<std::string> common = {"t2i", "--model", flux.string(), "--steps", "2", "--width", "32", "--height", "32"};
  std::vector<std::string> a = common, b = common;
  a.insert(a.end(), {"--prompt", "red circle", "--max-sequence-length", "32", "--out", (dir_ / "a.jpg").string()});
  b.insert(b.end(), {"--prompt-embeds", embeds, "--out", (dir_ / "b.jpg").string()});
  const auto ra = run(a), rb = run(b);
  ASSERT_EQ(ra.status, 0) << ra.err;
  ASSERT_EQ(rb.status, 0) << rb.err;
  EXPECT_NE(ra.err.find("text: CLIPTextModel (2 layers) + T5EncoderModel (2 layers, 32 tokens)"), std::string::npos) << ra.err;
  EXPECT_NE(ra.err.find("text encoding"), std::string::npos) << "the stage table has the encoders' time";
  EXPECT_EQ(read_file((dir_ / "a.jpg").string()), read_file((dir_ / "b.jpg").string()));
  // Another prompt gives another picture (the prompt reaches the model).
  std::vector<std::string> c = common;
  c.insert(c.end(), {"--prompt", "blue square", "--max-sequence-length", "32", "--out", (dir_ / "c.jpg").string()});
  ASSERT_EQ(run(c).status, 0);
  EXPECT_NE(read_file((dir_ / "a.jpg").string()), read_file((dir_ / "c.jpg").string()));
}

TEST_F(TextEncoderCli, T2vPromptEqualsItsOwnEmbeddingsFromEncodePrompt) {
  const fs::path wan = wan_folder(dir_);
  const std::string enc = (dir_ / "umt5.safetensors").string();
  ASSERT_EQ(run({"encode-prompt", "--model", wan.string(), "--pipeline", "wan", "--prompt", "a cat", "--prompt", "", "--max-length", "16",
                 "--out", enc})
                .status,
            0);
  const cubevec::SafetensorsFile e = cubevec::SafetensorsFile::open(enc);
  const std::string embeds = (dir_ / "embeds.safetensors").string();
  cubevec::write_safetensors(embeds,
                             {{"prompt_embeds", e.tensor("prompt_embeds_0")}, {"negative_prompt_embeds", e.tensor("prompt_embeds_1")}});
  const std::vector<std::string> common = {"t2v", "--model", wan.string(), "--steps",  "2", "--frames",
                                           "5",   "--width", "32",         "--height", "32"};
  std::vector<std::string> a = common, b = common;
  a.insert(a.end(), {"--prompt", "a cat", "--max-sequence-length", "16", "--out", (dir_ / "a.avi").string()});
  b.insert(b.end(), {"--prompt-embeds", embeds, "--out", (dir_ / "b.avi").string()});
  const auto ra = run(a), rb = run(b);
  ASSERT_EQ(ra.status, 0) << ra.err;
  ASSERT_EQ(rb.status, 0) << rb.err;
  EXPECT_EQ(read_file((dir_ / "a.avi").string()), read_file((dir_ / "b.avi").string()));
}

TEST_F(TextEncoderCli, BadFoldersAndFlagsAreOneLineErrors) {
  const fs::path flux = flux_folder(dir_);
  const auto t2i = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"t2i",
                                     "--model",
                                     flux.string(),
                                     "--steps",
                                     "1",
                                     "--width",
                                     "16",
                                     "--height",
                                     "16",
                                     "--prompt",
                                     "x",
                                     "--out",
                                     (dir_ / "x.jpg").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  std::ofstream(flux / "model_index.json") << R"({"_class_name": "FluxPipeline", "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"], "text_encoder_2": ["transformers", "Gemma2Model"], "tokenizer_2": ["transformers", "T5TokenizerFast"]})";
  auto r = t2i({});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("'text_encoder_2' is Gemma2Model, a text encoder class cubevec does not have"), std::string::npos) << r.err;
  std::ofstream(flux / "model_index.json") << R"({"tokenizer_2": ["transformers", "LlamaTokenizerFast"]})";
  r = t2i({});
  EXPECT_NE(r.err.find("'tokenizer_2' is LlamaTokenizerFast, a tokenizer class cubevec does not have"), std::string::npos) << r.err;
  fs::remove(flux / "model_index.json");
  r = t2i({"--max-sequence-length", "513"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--max-sequence-length"), std::string::npos) << r.err;
  fs::remove_all(flux / "tokenizer_2");
  r = t2i({});
  EXPECT_NE(r.err.find("has text_encoder/ (CLIP) but no tokenizer_2/"), std::string::npos) << r.err;
  std::ofstream(flux / "tokenizer_2") << "not a folder";
  r = t2i({});
  EXPECT_NE(r.err.find("/tokenizer_2 is not a folder"), std::string::npos) << r.err;
  fs::remove(flux / "tokenizer_2");
  r = run({"encode-prompt", "--model", flux.string(), "--encoder", "text_encoder_3", "--prompt", "x", "--out",
           (dir_ / "e.safetensors").string()});
  EXPECT_NE(r.err.find("--encoder must be text_encoder or text_encoder_2, got 'text_encoder_3'"), std::string::npos) << r.err;
  r = run({"encode-prompt", "--model", flux.string(), "--pipeline", "wan", "--prompt", "x", "--out", (dir_ / "e.safetensors").string()});
  EXPECT_NE(r.err.find("is a CLIP text encoder; Wan has none"), std::string::npos) << r.err;
  // A tokenizer folder without its vocabulary names the file.
  fs::remove(flux / "tokenizer" / "vocab.json");
  r = run({"encode-prompt", "--model", flux.string(), "--prompt", "x", "--out", (dir_ / "e.safetensors").string()});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("vocab.json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "e.safetensors"));
}

TEST_F(TextEncoderCli, MemoryNanWeightsAndNegativePromptsAreNamed) {
  const fs::path wan = wan_folder(dir_);
  const std::vector<std::string> t2v = {"t2v",
                                        "--model",
                                        wan.string(),
                                        "--steps",
                                        "1",
                                        "--frames",
                                        "5",
                                        "--width",
                                        "32",
                                        "--height",
                                        "32",
                                        "--out",
                                        (dir_ / "v.avi").string()};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = t2v;
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  // 4 heads x 4096^2 position bias and scores do not fit 100 MiB: refused before loading.
  auto r = with({"--prompt", "a cat", "--max-sequence-length", "4096", "--memory-limit", "100M"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("text encoding with umT5 needs about"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("more than --memory-limit 100M"), std::string::npos) << r.err;
  r = with({"--prompt", "a cat", "--negative-prompt", "caf\xe9"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--negative-prompt: invalid UTF-8"), std::string::npos) << r.err;
  r = with({"--prompt", "  \t "});
  EXPECT_NE(r.err.find("--prompt TEXT is required (the prompt given is only whitespace)"), std::string::npos) << r.err;
  // A NaN in umT5's final norm: named as the encoder's output, and by --check-weights as the weight.
  const std::string weights = (wan / "text_encoder" / "model.safetensors").string();
  cubevec::NamedTensors tensors;
  {
    const cubevec::SafetensorsFile file = cubevec::SafetensorsFile::open(weights);
    for (const auto& e : file.entries()) tensors.emplace_back(e.name, file.tensor(e.name).contiguous().clone());
  }
  for (auto& [name, tensor] : tensors)
    if (name == "encoder.final_layer_norm.weight") tensor.mutable_data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  cubevec::write_safetensors(weights, tensors);
  r = with({"--prompt", "a cat"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("UMT5EncoderModel (2 layers, 512 tokens)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the embeddings of --prompt are not finite"), std::string::npos) << r.err;
  r = with({"--prompt", "a cat", "--check-weights"});
  EXPECT_NE(r.err.find("weight 'encoder.final_layer_norm.weight'"), std::string::npos) << r.err;
}

TEST_F(TextEncoderCli, EncodePromptNamesBadConfigsAndMismatchedPipelines) {
  const fs::path flux = flux_folder(dir_);
  const std::string out = (dir_ / "e.safetensors").string();
  auto r =
      run({"encode-prompt", "--model", flux.string(), "--encoder", "text_encoder_2", "--pipeline", "wan", "--prompt", "x", "--out", out});
  EXPECT_NE(r.err.find("is a T5EncoderModel; --pipeline wan is for Wan's UMT5EncoderModel"), std::string::npos) << r.err;
  r = run({"encode-prompt", "--model", flux.string(), "--max-length", "1", "--prompt", "x", "--out", out});
  EXPECT_NE(r.err.find("--max-length must be at least 2 for CLIP"), std::string::npos) << r.err;
  r = run({"encode-prompt", "--model", (dir_ / "nope").string(), "--prompt", "x", "--out", out});
  EXPECT_NE(r.err.find("nope does not exist"), std::string::npos) << r.err;
  r = run({"encode-prompt", "--model", flux.string(), "--dtype", "f16", "--prompt", "x", "--out", out});
  EXPECT_NE(r.err.find("--dtype must be f32 or bf16, got 'f16'"), std::string::npos) << r.err;
  std::ofstream(flux / "text_encoder_2" / "config.json", std::ios::trunc)
      << R"({"model_type": "t5", "feed_forward_proj": "gated-gelu", "dense_act_fn": "relu"})";
  r = run({"encode-prompt", "--model", flux.string(), "--encoder", "text_encoder_2", "--prompt", "x", "--out", out});
  EXPECT_NE(r.err.find("'dense_act_fn'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not match feed_forward_proj 'gated-gelu'"), std::string::npos) << r.err;
  std::ofstream(flux / "text_encoder" / "config.json", std::ios::trunc) << "[1, 2]";
  r = run({"encode-prompt", "--model", flux.string(), "--prompt", "x", "--out", out});
  EXPECT_NE(r.err.find("text_encoder/config.json: expected a JSON object"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace text_encoder_cli_test
