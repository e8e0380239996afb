#include "base/strict_json.h"

#include <limits>

#include "base/regular_file.h"

#include <unordered_set>
#include <vector>

namespace cubevec {

namespace {

// nlohmann's message without its "[json.exception.parse_error.101] " tag: the reader wants the
// position and the reason, not the library's catalogue number.
std::string without_library_tag(const std::string& message) {
  if (message.rfind("[json.exception.", 0) == 0)
    if (const std::size_t end = message.find("] "); end != std::string::npos) return message.substr(end + 2);
  return message;
}

// A first, validating pass over the SAX events: bounded nesting and no repeated key. (nlohmann's
// parse callback cannot do this in linear time: after every nested object it rescans the parent
// object, so a header of 40,000 tensors took half a minute.) It also knows where each value
// goes, so a number too large for a double ("1e400") is reported with its key.
class StrictChecks : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit StrictChecks(int max_depth) : max_depth_(max_depth) {}
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    value();
    open_container(false);
    return true;
  }
  bool key(string_t& key) override {
    Level& level = levels_.back();
    if (!level.keys.insert(key).second)
      throw StrictJsonError(StrictJsonError::Kind::DuplicateKey, depth_, "the key '" + key + "' appears more than once in one object");
    level.key = key;
    return true;
  }
  bool end_object() override { return close_container(); }
  bool start_array(std::size_t) override {
    value();
    open_container(true);
    return true;
  }
  bool end_array() override { return close_container(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    std::string where;
    if (e.id == 406 && !levels_.empty()) where = " (the value of '" + value_path() + "')";  // number overflow
    throw StrictJsonError(StrictJsonError::Kind::Syntax, 0, "not valid JSON: " + without_library_tag(e.what()) + where);
  }

 private:
  struct Level {
    bool array = false;
    std::string key;                       // an object's latest key
    std::size_t values = 0;                // an array's elements so far
    std::unordered_set<std::string> keys;  // an object's keys so far
  };
  bool value() {
    if (!levels_.empty() && levels_.back().array) ++levels_.back().values;
    return true;
  }
  void open_container(bool array) {
    if (depth_ > max_depth_)
      throw StrictJsonError(StrictJsonError::Kind::TooDeep, depth_,
                            "JSON nests deeper than the " + std::to_string(max_depth_) + " levels expected");
    ++depth_;
    levels_.push_back({array, {}, 0, {}});
  }
  bool close_container() {
    levels_.pop_back();
    --depth_;
    return true;
  }
  // Where the value being parsed goes: "steps", "w.shape[1]" (arrays count the element in hand).
  std::string value_path() const {
    std::string path;
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      const Level& level = levels_[i];
      const bool innermost = i + 1 == levels_.size();
      if (level.array) path += "[" + std::to_string(innermost ? level.values : level.values - 1) + "]";
      else path += (path.empty() ? "" : ".") + level.key;
    }
    return path;
  }
  int max_depth_, depth_ = 0;  // depth_: containers open; a key of the top-level object is at 1
  std::vector<Level> levels_;  // the containers being parsed, outermost first
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
    throw StrictJsonError(StrictJsonError::Kind::Syntax, 0, "not valid JSON: " + without_library_tag(e.what()));
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

bool is_int64(const nlohmann::json& value) {
  return value.is_number_integer() &&
         !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

}  // namespace cubevec
