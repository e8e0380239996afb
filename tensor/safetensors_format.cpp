#include "tensor/safetensors_format.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "base/strict_json.h"

namespace cubevec {

namespace {

// In the format's declaration order, which is also increasing alignment rank.
constexpr SafetensorsDtype kDtypes[] = {
    {"BOOL", 8, DType::boolean},
    {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt},
    {"U8", 8, DType::u8},
    {"I8", 8, DType::i8},
    {"F8_E5M2", 8, std::nullopt},
    {"F8_E4M3", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt},
    {"F8_E4M3FNUZ", 8, std::nullopt},
    {"F8_E5M2FNUZ", 8, std::nullopt},
    {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt},
    {"F16", 16, DType::f16},
    {"BF16", 16, DType::bf16},
    {"I32", 32, DType::i32},
    {"U32", 32, std::nullopt},
    {"F32", 32, DType::f32},
    {"C64", 64, std::nullopt},
    {"F64", 64, std::nullopt},
    {"I64", 64, DType::i64},
    {"U64", 64, std::nullopt},
};

// Header text is shown in messages; keep quoted names readable and bounded.
std::string quote_name(std::string_view text) {
  constexpr std::size_t kMax = 120;
  return "'" + std::string(text.substr(0, kMax)) + (text.size() > kMax ? "...'" : "'");
}

bool is_valid_utf8(std::span<const std::byte> bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto b0 = static_cast<uint8_t>(bytes[i]);
    std::size_t length;
    uint32_t code, min_code;
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    if ((b0 & 0xe0) == 0xc0) {
      length = 2;
      code = b0 & 0x1fu;
      min_code = 0x80;
    } else if ((b0 & 0xf0) == 0xe0) {
      length = 3;
      code = b0 & 0x0fu;
      min_code = 0x800;
    } else if ((b0 & 0xf8) == 0xf0) {
      length = 4;
      code = b0 & 0x07u;
      min_code = 0x10000;
    } else return false;
    if (bytes.size() - i < length) return false;
    for (std::size_t k = 1; k < length; ++k) {
      const auto b = static_cast<uint8_t>(bytes[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      code = (code << 6) | (b & 0x3fu);
    }
    if (code < min_code || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return false;
    i += length;
  }
  return true;
}

std::string type_of(const nlohmann::json& value) { return value.type_name(); }

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value, const std::string& file) {
  const auto fail = [&](SafetensorsRule rule, const std::string& detail) { return SafetensorsError(file, name, rule, detail); };
  if (!value.is_object()) throw fail(SafetensorsRule::InvalidEntry, "entry is a JSON " + type_of(value) + ", expected an object");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!value.contains(field)) throw fail(SafetensorsRule::InvalidEntry, std::string("missing field '") + field + "'");

  SafetensorsEntry entry;
  entry.name = name;
  const auto& dtype = value["dtype"];
  if (!dtype.is_string()) throw fail(SafetensorsRule::UnknownDtype, "dtype is a JSON " + type_of(dtype) + ", expected a string");
  entry.dtype = find_safetensors_dtype(dtype.get_ref<const std::string&>());
  if (!entry.dtype) {
    std::string known;
    for (const auto& d : kDtypes) known += (known.empty() ? "" : ", ") + std::string(d.name);
    throw fail(SafetensorsRule::UnknownDtype,
               "unknown dtype " + quote_name(dtype.get_ref<const std::string&>()) + " (expected one of: " + known + ")");
  }
  const auto& shape = value["shape"];
  if (!shape.is_array()) throw fail(SafetensorsRule::InvalidShape, "shape is a JSON " + type_of(shape) + ", expected an array");
  for (const auto& size : shape) {
    if (!size.is_number_unsigned())
      throw fail(SafetensorsRule::InvalidShape, "shape " + shape.dump() + " holds " + size.dump() + ", expected non-negative integers");
    entry.shape.push_back(size.get<uint64_t>());
  }
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    throw fail(SafetensorsRule::InvalidOffsets, "data_offsets is " + offsets.dump() + ", expected [BEGIN, END] with non-negative integers");
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  return entry;
}

void check_spans(std::vector<SafetensorsEntry>& entries, const std::string& file) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t expected_begin = 0;
  for (const auto& e : entries) {
    const auto fail = [&](SafetensorsRule rule, const std::string& detail) { return SafetensorsError(file, e.name, rule, detail); };
    const std::string span = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
    if (e.begin != expected_begin)
      throw fail(SafetensorsRule::InvalidOffset,
                 "data_offsets " + span + " should begin at " + std::to_string(expected_begin) +
                     (e.begin < expected_begin ? " (it overlaps the previous tensor)" : " (it leaves a gap)"));
    if (e.end < e.begin) throw fail(SafetensorsRule::InvalidOffset, "data_offsets " + span + " ends before it begins");
    uint64_t elements = 1, bits = 0;
    for (uint64_t size : e.shape)
      if (__builtin_mul_overflow(elements, size, &elements))
        throw fail(SafetensorsRule::ValidationOverflow, "the element count of its shape overflows 64 bits");
    if (__builtin_mul_overflow(elements, uint64_t{e.dtype->bits}, &bits))
      throw fail(SafetensorsRule::ValidationOverflow, "its size in bits overflows 64 bits");
    // cubevec's own limit: strides are int64, so the sizes other than 0 must multiply within it even
    // when a 0 makes the tensor empty ([2^61, 0, 64] is valid safetensors but has no strides).
    int64_t reach = 1;
    for (uint64_t size : e.shape)
      if (size != 0 && (size > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(reach, static_cast<int64_t>(size), &reach)))
        throw fail(SafetensorsRule::ValidationOverflow, "its sizes multiply beyond int64 (cubevec addresses tensors with int64 strides)");
    if (bits % 8 != 0)
      throw fail(SafetensorsRule::MisalignedSlice,
                 std::to_string(elements) + " elements of " + std::string(e.dtype->name) + " do not fill whole bytes");
    if (e.end - e.begin != bits / 8)
      throw fail(SafetensorsRule::TensorInvalidInfo, "data_offsets " + span + " span " + std::to_string(e.end - e.begin) + " bytes, but " +
                                                         std::to_string(elements) + " elements of " + std::string(e.dtype->name) +
                                                         " need " + std::to_string(bits / 8));
    expected_begin = e.end;
  }
}

// The fast path for a well-formed header: one SAX pass straight into entries, no DOM (a header of
// 10^6 tensors built a million small JSON objects). It accepts only what the strict path accepts
// without remark and gives up (returns false) at anything else (a wrong type, a missing or unknown
// field, a repeated name, nesting, a syntax error); the strict path then parses the header again
// and reports the problem with its usual message, so both paths agree on every input.
class FastHeader : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;

  bool null() override { return in_metadata_key() && first_metadata() ? (state_ = State::top, true) : false; }
  bool boolean(bool) override { return false; }
  bool number_integer(number_integer_t) override { return false; }  // negative
  bool number_unsigned(number_unsigned_t value) override {
    if (state_ == State::shape) return entry_.shape.push_back(value), true;
    if (state_ == State::offsets && offsets_ < 2) return (offsets_++ == 0 ? entry_.begin : entry_.end) = value, true;
    return false;
  }
  bool number_float(number_float_t, const string_t&) override { return false; }
  bool binary(binary_t&) override { return false; }
  bool string(string_t& value) override {
    if (state_ == State::dtype_value) {
      entry_.dtype = find_safetensors_dtype(value);
      state_ = State::entry;
      return entry_.dtype != nullptr;
    }
    if (state_ == State::metadata_value) {
      state_ = State::metadata;
      return metadata.emplace(std::move(metadata_key_), std::move(value)).second;
    }
    return false;
  }
  bool start_object(std::size_t) override {
    if (state_ == State::start) return state_ = State::top, true;
    if (state_ == State::top_value) {
      if (name_ == "__metadata__") return first_metadata() && (state_ = State::metadata, true);
      entry_ = SafetensorsEntry{};
      entry_.name = std::move(name_);
      seen_ = 0;
      return state_ = State::entry, true;
    }
    return false;
  }
  bool key(string_t& key) override {
    if (state_ == State::top) return name_ = std::move(key), state_ = State::top_value, true;
    if (state_ == State::metadata) return metadata_key_ = std::move(key), state_ = State::metadata_value, true;
    if (state_ != State::entry) return false;
    const int field = key == "dtype" ? 1 : key == "shape" ? 2 : key == "data_offsets" ? 4 : 0;
    if (field == 0 || (seen_ & field)) return false;  // unknown or repeated: the strict path decides
    seen_ |= field;
    state_ = field == 1 ? State::dtype_value : field == 2 ? State::shape_value : State::offsets_value;
    return true;
  }
  bool end_object() override {
    if (state_ == State::entry) {
      if (seen_ != 7) return false;
      entries.push_back(std::move(entry_));
      return state_ = State::top, true;
    }
    if (state_ == State::metadata) return state_ = State::top, true;
    if (state_ == State::top) return state_ = State::done, true;
    return false;
  }
  bool start_array(std::size_t) override {
    if (state_ == State::shape_value) return state_ = State::shape, true;
    if (state_ == State::offsets_value) return offsets_ = 0, state_ = State::offsets, true;
    return false;
  }
  bool end_array() override {
    if (state_ == State::shape) return state_ = State::entry, true;
    if (state_ == State::offsets && offsets_ == 2) return state_ = State::entry, true;
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  enum class State {
    start,
    top,
    top_value,
    entry,
    dtype_value,
    shape_value,
    shape,
    offsets_value,
    offsets,
    metadata,
    metadata_value,
    done
  };
  bool in_metadata_key() const { return state_ == State::top_value && name_ == "__metadata__"; }
  bool first_metadata() { return !std::exchange(metadata_seen_, true); }  // a second one is a repeated name
  State state_ = State::start;
  SafetensorsEntry entry_;
  std::string name_, metadata_key_;
  int seen_ = 0, offsets_ = 0;
  bool metadata_seen_ = false;
};

}  // namespace

std::string_view rule_name(SafetensorsRule rule) {
  switch (rule) {
    case SafetensorsRule::HeaderTooSmall: return "HeaderTooSmall";
    case SafetensorsRule::HeaderTooLarge: return "HeaderTooLarge";
    case SafetensorsRule::InvalidHeaderLength: return "InvalidHeaderLength";
    case SafetensorsRule::InvalidUtf8: return "InvalidUtf8";
    case SafetensorsRule::InvalidJson: return "InvalidJson";
    case SafetensorsRule::InvalidMetadata: return "InvalidMetadata";
    case SafetensorsRule::InvalidEntry: return "InvalidEntry";
    case SafetensorsRule::UnknownDtype: return "UnknownDtype";
    case SafetensorsRule::InvalidShape: return "InvalidShape";
    case SafetensorsRule::InvalidOffsets: return "InvalidOffsets";
    case SafetensorsRule::DuplicateName: return "DuplicateName";
    case SafetensorsRule::InvalidOffset: return "InvalidOffset";
    case SafetensorsRule::ValidationOverflow: return "ValidationOverflow";
    case SafetensorsRule::MisalignedSlice: return "MisalignedSlice";
    case SafetensorsRule::TensorInvalidInfo: return "TensorInvalidInfo";
    case SafetensorsRule::IncompleteBuffer: return "IncompleteBuffer";
  }
  return "Unknown";
}

SafetensorsError::SafetensorsError(std::string file, std::string tensor, SafetensorsRule rule, const std::string& detail)
    : Error(file + ": " + (tensor.empty() ? "" : "tensor " + quote_name(tensor) + ": ") + detail + " [" + std::string(rule_name(rule)) +
            "]"),
      file_(std::move(file)),
      tensor_(std::move(tensor)),
      rule_(rule) {}

const SafetensorsDtype* find_safetensors_dtype(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return &d;
  return nullptr;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  throw Error("safetensors_dtype_name: DType " + std::string(dtype_name(dtype)) + " has no safetensors name");
}

int safetensors_dtype_rank(DType dtype) {
  const SafetensorsDtype* d = find_safetensors_dtype(safetensors_dtype_name(dtype));
  return static_cast<int>(d - std::begin(kDtypes));
}

namespace {

// Fast path: a well-formed header in one pass into `header`'s entries (in name order, as the
// strict path's sorted JSON object gives them) and metadata. False, with `header` untouched, for
// anything the strict path must judge (a repeated name included).
bool read_entries_fast(std::string_view json_text, SafetensorsHeader& header) {
  // The SAX parser stops at a NUL byte; the strict path refuses one (parse_strict_json).
  if (json_text.find('\0') != std::string_view::npos) return false;
  FastHeader fast;
  if (!nlohmann::json::sax_parse(json_text.begin(), json_text.end(), &fast)) return false;
  std::sort(fast.entries.begin(), fast.entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  if (std::adjacent_find(fast.entries.begin(), fast.entries.end(), [](const auto& a, const auto& b) { return a.name == b.name; }) !=
      fast.entries.end())
    return false;
  header.entries = std::move(fast.entries);
  header.metadata = std::move(fast.metadata);
  return true;
}

// The strict path: the DOM, each entry and the metadata checked with a message naming the problem.
void read_entries_strict(std::string_view json_text, const std::string& file_name, SafetensorsHeader& header) {
  const auto fail = [&](SafetensorsRule rule, const std::string& detail) { return SafetensorsError(file_name, "", rule, detail); };
  nlohmann::json json;
  try {
    // Depth 2 is the deepest a header needs: object > entry > shape / data_offsets.
    json = parse_strict_json(json_text, 2);
  } catch (const StrictJsonError& e) {
    const bool duplicate_name = e.kind() == StrictJsonError::Kind::DuplicateKey && e.depth() == 1;
    throw fail(duplicate_name ? SafetensorsRule::DuplicateName : SafetensorsRule::InvalidJson, std::string("header: ") + e.what());
  }
  if (!json.is_object()) throw fail(SafetensorsRule::InvalidJson, "header is a JSON " + type_of(json) + ", expected an object");
  for (const auto& [name, value] : json.items()) {
    if (name != "__metadata__") {
      header.entries.push_back(parse_entry(name, value, file_name));
      continue;
    }
    if (value.is_null()) continue;  // the reference reader treats null as absent
    if (!value.is_object())
      throw fail(SafetensorsRule::InvalidMetadata, "__metadata__ is a JSON " + type_of(value) + ", expected an object");
    for (const auto& [key, text_value] : value.items()) {
      if (!text_value.is_string())
        throw fail(SafetensorsRule::InvalidMetadata,
                   "__metadata__ key " + quote_name(key) + " holds a JSON " + type_of(text_value) + ", expected a string");
      header.metadata[key] = text_value.get<std::string>();
    }
  }
}

SafetensorsHeader parse_header(std::span<const std::byte> file, const std::string& file_name, bool try_fast) {
  const auto fail = [&](SafetensorsRule rule, const std::string& detail) { return SafetensorsError(file_name, "", rule, detail); };
  if (file.size() < 8)
    throw fail(SafetensorsRule::HeaderTooSmall,
               "file is " + std::to_string(file.size()) + " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(file[i]);  // little-endian
  if (n > kMaxSafetensorsHeader)
    throw fail(SafetensorsRule::HeaderTooLarge,
               "header length " + std::to_string(n) + " exceeds the format's limit of " + std::to_string(kMaxSafetensorsHeader) + " bytes");
  if (n > file.size() - 8)
    throw fail(SafetensorsRule::InvalidHeaderLength,
               "header length " + std::to_string(n) + " runs past the end of the " + std::to_string(file.size()) + "-byte file");
  const auto text = file.subspan(8, n);
  if (!is_valid_utf8(text)) throw fail(SafetensorsRule::InvalidUtf8, "header is not valid UTF-8");

  SafetensorsHeader header;
  header.header_length = n;
  header.data_start = 8 + n;
  const std::string_view json_text(reinterpret_cast<const char*>(text.data()), text.size());
  if (!try_fast || !read_entries_fast(json_text, header)) read_entries_strict(json_text, file_name, header);
  check_spans(header.entries, file_name);
  const uint64_t data_bytes = header.entries.empty() ? 0 : header.entries.back().end;
  if (data_bytes != file.size() - header.data_start)
    throw fail(SafetensorsRule::IncompleteBuffer, "the tensors cover " + std::to_string(data_bytes) + " data bytes but the file holds " +
                                                      std::to_string(file.size() - header.data_start) + " after the header");
  return header;
}

}  // namespace

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& file_name) {
  return parse_header(file, file_name, true);
}

SafetensorsHeader parse_safetensors_strict(std::span<const std::byte> file, const std::string& file_name) {
  return parse_header(file, file_name, false);
}

}  // namespace cubevec
