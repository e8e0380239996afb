#include "cli/output_overlap.h"

#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"

namespace cubevec::cli {

namespace {

namespace fs = std::filesystem;

struct PathFlag {
  std::string flag, path;
};

bool is_output(const CLI::App& command, const std::string& flag) {
  if (flag == "--json" || flag == "--trace" || flag == "--attn-tune-cache" || flag == "--tune-cache" || flag == "--frames-dir") return true;
  return flag == "--out" && command.get_name() != "quantize";  // quantize --out is a folder it fills
}

// Free text, never a path: a prompt that happens to name a file is not an input file.
bool is_text(const std::string& flag) { return flag == "--prompt" || flag == "--negative-prompt"; }

fs::path canonical_or_empty(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(path, ec);
  return ec ? fs::path() : p;
}

bool inside(const fs::path& child, const fs::path& folder) {
  auto c = child.begin();
  for (auto f = folder.begin(); f != folder.end(); ++f, ++c)
    if (c == child.end() || *c != *f) return false;
  return true;
}

// A file --frames-dir would overwrite: DIR/frame_NNNNN.png.
bool is_frame_file(const fs::path& file, const fs::path& frames_dir) {
  const std::string name = file.filename().string();
  return file.parent_path() == frames_dir && name.size() == 15 && name.rfind("frame_", 0) == 0 && name.substr(11) == ".png" &&
         name.find_first_not_of("0123456789", 6) == 11;
}

}  // namespace

void check_outputs_against_inputs(const CLI::App& command) {
  std::vector<PathFlag> outputs, inputs;
  for (const CLI::Option* option : command.get_options()) {
    if (option->count() == 0) continue;
    const std::string flag = option->get_name();  // "--out", or a positional's name
    for (const std::string& value : option->results()) {
      if (value.empty()) continue;
      if (flag == "--out" && command.get_name() == "quantize") continue;  // an output folder (quantize checks its files)
      std::error_code ec;                                                 // a value that cannot be a path (too long, ...) is no input file
      if (is_output(command, flag)) outputs.push_back({flag, value});
      else if (!is_text(flag) && fs::exists(fs::symlink_status(value, ec))) inputs.push_back({flag, value});
    }
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const PathFlag& out = outputs[i];
    const fs::path target = canonical_or_empty(out.path);
    if (target.empty()) continue;
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (canonical_or_empty(outputs[j].path) == target)
        throw Error(outputs[j].flag + " " + outputs[j].path + ": is also the " + out.flag + " file; give each output its own path");
    // --frames-dir is a folder of frame_NNNNN.png files: none of them may be another file of the run.
    if (out.flag == "--frames-dir") {
      for (const std::vector<PathFlag>* others : {&outputs, &inputs})
        for (const PathFlag& other : *others)
          if (&other != &out && is_frame_file(canonical_or_empty(other.path), target))
            throw Error(out.flag + " " + out.path + ": would overwrite the " + other.flag + " file " + other.path +
                        " with a frame; write the frames to another folder");
    }
    for (const PathFlag& in : inputs) {
      const fs::path source = canonical_or_empty(in.path);
      if (source.empty()) continue;
      std::error_code ec;
      if (fs::is_directory(source, ec) ? inside(target, source) : (target == source || fs::equivalent(out.path, in.path, ec)))
        throw Error(out.flag + " " + out.path + ": " +
                    (fs::is_directory(source, ec) ? "lies inside the " + in.flag + " folder " + in.path : "is the " + in.flag + " file") +
                    "; write the result to another path");
    }
  }
}

}  // namespace cubevec::cli
