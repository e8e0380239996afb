#include "tensor/strict_json.h"

#include "tensor/regular_file.h"

#include <unordered_set>
#include <vector>

namespace cubevec {

namespace {

// A first, validating pass over the SAX events: bounded nesting and no repeated key. (nlohmann's
// parse callback cannot do this in linear time: after every nested object it rescans the parent
// object, so a header of 40,000 tensors took half a minute.)
class StrictChecks : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit StrictChecks(int max_depth) : max_depth_(max_depth) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_container();
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& key) override {
    if (!keys_.back().insert(key).second)
      throw StrictJsonError(StrictJsonError::Kind::DuplicateKey, depth_, "the key '" + key + "' appears more than once in one object");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    open_container();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw StrictJsonError(StrictJsonError::Kind::Syntax, 0, std::string("not valid JSON: ") + e.what());
  }

 private:
  void open_container() {
    if (depth_ > max_depth_)
      throw StrictJsonError(StrictJsonError::Kind::TooDeep, depth_, "JSON nests deeper than the " + std::to_string(max_depth_) + " levels expected");
    ++depth_;
  }
  int max_depth_, depth_ = 0;  // depth_: containers open; a key of the top-level object is at 1
  std::vector<std::unordered_set<std::string>> keys_;  // keys seen in each object being parsed
};

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, int max_depth) {
  // The parser takes a NUL byte for the end of the input: what follows would be ignored unseen.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw StrictJsonError(StrictJsonError::Kind::Syntax, 0,
                          "not valid JSON: a NUL byte at offset " + std::to_string(nul) + " (JSON text has none)");
  StrictChecks checks(max_depth);
  nlohmann::json::sax_parse(text.begin(), text.end(), &checks);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // the first pass has seen every syntax error
    throw StrictJsonError(StrictJsonError::Kind::Syntax, 0, std::string("not valid JSON: ") + e.what());
  }
}

nlohmann::json read_json_file(const std::string& path, int max_depth) {
  const std::string text = read_regular_file(path);
  try {
    return parse_strict_json(text, max_depth);
  } catch (const StrictJsonError& e) {
    throw Error(path + ": " + (e.kind() == StrictJsonError::Kind::Syntax ? "" : "not valid JSON: ") + e.what());
  }
}

}  // namespace cubevec
