// The shipped tiny model's text encoder (pipelines/tiny_text_encoder.h) against its PyTorch twin:
// token ids and the sequence / pooled embeddings of a few prompts, written by
// tools/tinyflux/sample.py into tests/data/tinyflux_reference.safetensors; the tokenizer's
// splitting and lower-casing; the errors for unknown words, long prompts and inconsistent files.
//
// Tolerance: max |got - expected| <= 1e-4 * max(1, max |expected|) (the reference is an f32 torch run).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/tiny_text_encoder.h"
#include "base/error.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace tiny_text_encoder_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using models::TinyTextEncoder;

const std::string kModel = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
const std::string kReference = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/tinyflux_reference.safetensors";

TinyTextEncoder& encoder() {
  static std::unique_ptr<TinyTextEncoder> e = TinyTextEncoder::load(kModel);
  return *e;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = testing::values(got), w = testing::values(want);
  double scale = 1, worst = 0;
  for (double x : w) scale = std::max(scale, std::fabs(x));
  for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::isnan(g[i]) ? INFINITY : std::fabs(g[i] - w[i]));
  EXPECT_LE(worst, 1e-4 * scale) << what;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TinyTextEncoder, MatchesThePyTorchEncoder) {
  const SafetensorsFile ref = SafetensorsFile::open(kReference);
  const auto prompts = nlohmann::json::parse(ref.metadata().at("text_prompts"));
  ASSERT_GE(prompts.size(), 4u);
  for (const auto& [index, prompt] : prompts.items()) {
    const std::string p = "text." + index + ".";
    const std::vector<int32_t> ids = encoder().tokenizer().encode(prompt.get<std::string>());
    const Tensor want_ids = ref.tensor(p + "input_ids").contiguous();
    ASSERT_EQ(static_cast<int64_t>(ids.size()), want_ids.numel()) << prompt;
    for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], want_ids.data<int32_t>()[i]) << prompt << " token " << i;
    const models::PromptEmbeddings e = encoder().encode(prompt.get<std::string>());
    expect_close(e.sequence, ref.tensor(p + "sequence"), "sequence of '" + prompt.get<std::string>() + "'");
    expect_close(e.pooled, ref.tensor(p + "pooled"), "pooled of '" + prompt.get<std::string>() + "'");
  }
}

TEST(TinyTextEncoder, ShapesFitTheShippedTransformer) {
  const models::PromptEmbeddings e = encoder().encode("a red circle on a blue background");
  EXPECT_EQ(e.sequence.shape(), (Shape{1, encoder().tokenizer().max_length(), encoder().config().hidden_size}));
  EXPECT_EQ(e.pooled.shape(), (Shape{1, encoder().config().pooled_projection_dim}));
}

TEST(TinyTextEncoder, TokenizerLowerCasesAndSplitsOnPunctuation) {
  const auto& t = encoder().tokenizer();
  EXPECT_EQ(t.split("  An ORANGE triangle,at the top. "), (std::vector<std::string>{"an", "orange", "triangle", "at", "the", "top"}));
  EXPECT_EQ(t.encode("A red circle"), t.encode("a  red,circle!"));
  const std::vector<int32_t> empty = t.encode("");
  EXPECT_EQ(static_cast<int64_t>(empty.size()), t.max_length());
  for (int32_t id : empty) EXPECT_EQ(id, t.pad_id());
  // The empty prompt (the unconditional input of CFG) encodes: pooled is the projection's bias.
  EXPECT_NO_THROW(encoder().encode(""));
}

TEST(TinyTextEncoder, UnknownWordsAreAnErrorListingTheVocabulary) {
  const std::string msg = error_of([] { encoder().encode("a red cat on a blue background"); });
  EXPECT_NE(msg.find("the prompt has a word this model does not know: 'cat'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("It knows these 30 words: a an two small medium large red orange yellow green blue purple white black circle"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("<pad>"), std::string::npos) << "the pad token is not a word to offer: " << msg;
  const std::string two = error_of([] { encoder().encode("a Pink Circle on a grey background, pink"); });
  EXPECT_NE(two.find("the prompt has 2 words this model does not know: 'pink', 'grey'. It knows"), std::string::npos) << two;
  // An essay of unknown words is one readable line: ten words listed, each shortened, and a count.
  std::string essay;
  for (int i = 0; i < 20000; ++i) essay += "word" + std::to_string(i) + std::string(i == 3 ? 100 : 0, 'x') + " ";
  const std::string many = error_of([&] { encoder().encode(essay); });
  EXPECT_NE(many.find("the prompt has 20000 words this model does not know: 'word0', 'word1', 'word2', 'word3xxx"), std::string::npos)
      << many.substr(0, 300);
  EXPECT_NE(many.find("...', 'word4'"), std::string::npos) << many.substr(0, 300);
  EXPECT_NE(many.find("'word9' and 19990 more. It knows"), std::string::npos) << many.substr(0, 400);
  EXPECT_LT(many.size(), 1500u);
  EXPECT_NE(error_of([] { encoder().encode("<pad>"); }).find("does not know: '<pad>'"), std::string::npos);
  std::string eighteen;
  for (int i = 0; i < 18; ++i) eighteen += "red ";
  const std::string long_prompt = error_of([&] { encoder().encode(eighteen); });
  EXPECT_NE(long_prompt.find("the prompt has 18 words; this model's tokenizer"), std::string::npos) << long_prompt;
  EXPECT_NE(long_prompt.find("takes at most 16"), std::string::npos) << long_prompt;
}

// A copy of the model's text_encoder/ and tokenizer/ in a scratch directory, with one file changed.
class TinyTextEncoderFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cubevec_tte_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(kModel + "/text_encoder", dir_ / "text_encoder", fs::copy_options::recursive);
    fs::copy(kModel + "/tokenizer", dir_ / "tokenizer", fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void edit_json(const std::string& rel, const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(dir_ / rel);
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(dir_ / rel) << j.dump(1);
  }
  std::string load_error() {
    return error_of([&] { TinyTextEncoder::load(dir_.string()); });
  }
  fs::path dir_;
};

TEST_F(TinyTextEncoderFiles, LoadsUnchanged) { EXPECT_NO_THROW(TinyTextEncoder::load(dir_.string())); }

TEST_F(TinyTextEncoderFiles, ConfigErrorsNameTheKey) {
  edit_json("text_encoder/config.json", [](nlohmann::json& j) { j["num_experts"] = 4; });
  EXPECT_NE(load_error().find("unknown key 'num_experts'"), std::string::npos) << load_error();
  edit_json("text_encoder/config.json", [](nlohmann::json& j) {
    j.erase("num_experts");
    j["hidden_act"] = "relu";
  });
  EXPECT_NE(load_error().find("'hidden_act' must be one of \"gelu_tanh\""), std::string::npos) << load_error();
  edit_json("text_encoder/config.json", [](nlohmann::json& j) {
    j["hidden_act"] = "gelu_tanh";
    j.erase("hidden_size");
  });
  EXPECT_NE(load_error().find("missing required key 'hidden_size'"), std::string::npos) << load_error();
}

TEST_F(TinyTextEncoderFiles, TokenizerMustMatchTheEncoder) {
  edit_json("tokenizer/vocab.json", [](nlohmann::json& j) { j["pink"] = static_cast<int>(j.size()); });
  EXPECT_NE(load_error().find("has 32 words but"), std::string::npos) << load_error();
  edit_json("tokenizer/vocab.json", [](nlohmann::json& j) {
    j.erase("pink");
    j["red"] = 1;  // the id of "a" as well
  });
  EXPECT_NE(load_error().find("is given to more than one word"), std::string::npos) << load_error();
}

TEST_F(TinyTextEncoderFiles, MissingWeightsAreNamed) {
  for (const auto& entry : fs::directory_iterator(dir_ / "text_encoder"))
    if (entry.path().extension() == ".safetensors") {
      const SafetensorsFile f = SafetensorsFile::open(entry.path().string());
      NamedTensors kept;
      for (const auto& e : f.entries())
        if (e.name != "pooled_projection.bias") kept.push_back({e.name, f.tensor(e.name)});
      const std::string path = entry.path().string();
      write_safetensors(path + ".tmp", kept);
      fs::rename(path + ".tmp", path);
    }
  EXPECT_NE(load_error().find("pooled_projection.bias"), std::string::npos) << load_error();
}

}  // namespace tiny_text_encoder_test
}  // namespace cubevec
