// parse_strict_json's own errors (the safetensors corpus covers duplicates, depth and NUL bytes
// through the header parser): a number too large for a double names where it stands, and the
// values around it do not shift the path it reports.
#include <gtest/gtest.h>

#include "base/strict_json.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace strict_json_test {  // named after the file: unity batches never mix two files' helpers

using testing::message_of;

TEST(StrictJson, ANumberOverflowNamesItsKey) {
  const struct {
    std::string text, where;
  } cases[] = {
      {R"({"width": 64, "steps": 1e400})", "(the value of 'steps')"},
      {R"({"a": {"b": [1, 2, -1e999]}})", "(the value of 'a.b[2]')"},
      {R"({"a": [[0], {"c": [1e400]}]})", "(the value of 'a[1].c[0]')"},
      {R"({"a": [], "b": {"x": null}, "c": 2e308})", "(the value of 'c')"},
  };
  for (const auto& c : cases) {
    const std::string message = message_of([&] { parse_strict_json(c.text, 16); });
    EXPECT_NE(message.find("number overflow"), std::string::npos) << c.text << ": " << message;
    EXPECT_NE(message.find(c.where), std::string::npos) << c.text << ": " << message;
  }
  // A top-level number has no key to name; other syntax errors are as before.
  EXPECT_EQ(message_of([] { parse_strict_json("1e400", 16); }).find("(the value of"), std::string::npos);
  EXPECT_EQ(message_of([] { parse_strict_json(R"({"a": 1,})", 16); }).find("(the value of"), std::string::npos);
  EXPECT_DOUBLE_EQ(parse_strict_json(R"({"a": [1, {"b": 1e300}]})", 16)["a"][1]["b"].get<double>(), 1e300);
}

}  // namespace strict_json_test
}  // namespace cubevec
