// WanPipeline's prompt cleaning (HTML unescaped twice, whitespace collapsed and stripped) against
// goldens from tests/reference/make_prompt_clean_goldens.py (Python's html.unescape and str.strip,
// the regex module's \s): named references with and without ';', the longest-prefix rule, numeric
// references with the CP-1252 and U+FFFD rules, Unicode spaces, the characters strip() removes but
// \s does not.
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/strict_json.h"
#include "tokenizers/prompt_clean.h"

namespace prompt_clean_test {  // named after the file: unity batches never mix two files' helpers

TEST(WanPromptClean, MatchesPython) {
  const nlohmann::json goldens = cubevec::read_json_file(std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/prompt_clean_goldens.json");
  ASSERT_GE(goldens["cases"].size(), 10u);
  for (const auto& c : goldens["cases"])
    EXPECT_EQ(cubevec::tokenizers::wan_prompt_clean(c["prompt"].get<std::string>()), c["clean"].get<std::string>())
        << "prompt: " << c["prompt"].get<std::string>();
}

TEST(WanPromptClean, UnescapeOnceAndBadText) {
  EXPECT_EQ(cubevec::tokenizers::html_unescape("&amp;lt; &eacute;"), "&lt; \xc3\xa9");
  try {
    cubevec::tokenizers::wan_prompt_clean("caf\xe9", "--negative-prompt");
    FAIL() << "invalid UTF-8 accepted";
  } catch (const cubevec::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--negative-prompt: invalid UTF-8 at byte 3"), std::string::npos) << e.what();
  }
}

}  // namespace prompt_clean_test
