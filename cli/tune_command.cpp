// `cubevec tune`: fills the tuning file ahead of time, so no later run pauses on its first GEMM of a
// kind to calibrate. Measures every variant of each GEMM family (f32, bf16) and shape class at the
// Cube unit's thread count (and at one thread: attention's math path runs its GEMMs per head), with
// a progress bar, then prints the choices. Entries already in the file are kept unless --again.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "ops/attention_tuner.h"
#include "cli/device_flags.h"
#include "ops/gemm/tuner.h"
#include "base/error.h"
#include "base/interrupt.h"
#include "base/output_file.h"

namespace cubevec::cli {

namespace {

namespace g = ops::gemm;

struct TuneFlags {
  std::vector<std::string> families{"f32", "bf16", "int8"}, shapes{"skinny", "small", "large"};
  bool again = false;
};

template <class E>
std::vector<E> parse_names(const std::vector<std::string>& names, const char* flag, std::initializer_list<E> all,
                           std::string_view (*name_of)(E)) {
  std::vector<E> out;
  for (const std::string& name : names) {
    const auto found = std::find_if(all.begin(), all.end(), [&](E e) { return name_of(e) == name; });
    if (found == all.end()) {
      std::string known;
      for (E e : all) known += (known.empty() ? "" : ", ") + std::string(name_of(e));
      throw Error(std::string(flag) + ": unknown name '" + name + "' (expected one of: " + known + ")");
    }
    if (std::find(out.begin(), out.end(), *found) == out.end()) out.push_back(*found);
  }
  return out;
}

void print_bar(const g::GemmTuneKey& key, std::size_t done, std::size_t total, const std::string& last) {
  const int width = 24, filled = static_cast<int>(static_cast<std::size_t>(width) * done / std::max<std::size_t>(total, 1));
  std::fprintf(stderr, "\r%-34s [%s%s] %zu/%zu %-36s", key.text().c_str(), std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(width - filled), '.').c_str(), done, total, last.c_str());
}

int run_tune(const TuneFlags& f, const DeviceFlags& device_flags) {
  const auto families = parse_names<g::GemmFamily>(f.families, "--families", {g::GemmFamily::f32, g::GemmFamily::bf16, g::GemmFamily::int8},
                                                   g::gemm_family_name);
  const auto shapes = parse_names<g::ShapeClass>(f.shapes, "--shapes", {g::ShapeClass::skinny, g::ShapeClass::small, g::ShapeClass::large},
                                                 g::shape_class_name);
  const DeviceProfile profile = device_flags.resolve();
  const std::set<int> thread_counts{1, profile.cube_threads};
  g::GemmTuner& tuner = g::GemmTuner::global();
  tuner.load_default_once();
  const std::string file = tuner.file();
  std::error_code ec;  // the default file's cache folder is cubevec's to make (a fresh machine has none); a named file's must exist
  if (!file.empty() && !tuner.strict()) std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  if (!file.empty()) check_output_path(file, "tuning file");  // tune writes it: a read-only file is refused before measuring
  // A named file must be valid throughout before anything is measured into it, its attention
  // section too (as `attention --tune-cache` and every generation command require).
  if (!file.empty() && tuner.strict()) try {
      ops::AttentionTuner().merged_section(g::read_tuning_section(file, "attention"), "", nlohmann::json::array());
    } catch (const Error& e) {
      throw Error("tuning file " + file + " is not valid: " + e.what());
    }
  std::fprintf(stderr, "tune: %s; caches %s; ISA %s; tuning file %s\n", g::cpu_model_name().c_str(), g::this_cpu_caches().text().c_str(),
               std::string(g::isa_name(g::best_isa())).c_str(),
               file.empty() ? "(none: nothing measured is saved; see the warning above, or set HOME or XDG_CACHE_HOME)" : file.c_str());
  std::vector<g::GemmTuneEntry> results;
  for (int threads : thread_counts)
    for (g::GemmFamily family : families)
      for (g::ShapeClass shape : shapes) {
        throw_if_interrupted();
        const g::GemmTuneKey key{family, g::best_isa(), shape, threads};
        std::optional<g::TuningFileLock> file_lock;  // a process measuring this key meanwhile finishes first
        if (!file.empty()) file_lock.emplace(file);
        if (!f.again) tuner.adopt_new_file_entries();
        if (!f.again)
          if (auto found = tuner.find(key)) {
            std::fprintf(stderr, "%-34s already in the tuning file (--again to measure it anew)\n", key.text().c_str());
            results.push_back(*found);
            continue;
          }
        const std::size_t total = g::candidate_variants(family, key.isa).size();
        std::size_t done = 0;
        print_bar(key, 0, total, "");
        g::GemmTuneEntry entry;
        try {
          entry = g::calibrate(key, g::this_cpu_caches(), [&](const g::VariantRate& r) {
            char rate[64];
            std::snprintf(rate, sizeof rate, "%s %.0f G%s/s", r.variant.name().c_str(), r.gflops,
                          family == g::GemmFamily::int8 ? "OP" : "FLOP");
            print_bar(key, ++done, total, rate);
          });
        } catch (...) {
          std::fprintf(stderr, "\n");
          throw;
        }
        std::fprintf(stderr, "\n");
        entry = tuner.add_measurements(std::move(entry));  // keeps the rates of kernels not measured now (a forced run)
        try {
          tuner.save();  // after each key: an interrupted tune keeps what it measured
        } catch (const Interrupted&) {
          throw;
        } catch (const Error& e) {
          // A named file must take the result; the default one became unusable during the run (another
          // cubevec replaced it): the table below still says what was measured.
          if (tuner.strict()) throw;
          std::fprintf(stderr, "warning: not saved: %s\n", e.what());
        }
        results.push_back(entry);
      }
  std::printf("%-34s %-16s %10s   %s\n", "family ISA shape threads", "choice", "GFLOP/s", "considered (GFLOP/s)");
  for (const auto& e : results) {
    double chosen_rate = 0;
    std::string considered;
    for (const auto& r : e.considered) {
      if (r.variant == e.choice) chosen_rate = r.gflops;
      char item[64];
      std::snprintf(item, sizeof item, "%s%s %.0f", considered.empty() ? "" : ", ", r.variant.name().c_str(), r.gflops);
      considered += item;
    }
    std::printf("%-34s %-16s %10.0f   %s\n", e.key.text().c_str(), e.choice.name().c_str(), chosen_rate, considered.c_str());
  }
  return 0;
}

}  // namespace

CommandRunner add_tune_command(CLI::App& app) {
  auto* command = app.add_subcommand("tune", "Calibrate the GEMM kernels for this machine and fill the tuning file");
  auto flags = std::make_shared<TuneFlags>();
  auto device_flags = add_device_flags(*command);
  command->add_option("--families", flags->families, "GEMM families to calibrate: f32, bf16, int8 (default all)")->delimiter(',');
  command->add_option("--shapes", flags->shapes, "Shape classes: skinny (M < 256), small (256..1024), large (default all)")->delimiter(',');
  command->add_flag("--again", flags->again, "Measure keys the tuning file already has");
  return [flags, device_flags] { return run_tune(*flags, *device_flags); };
}

}  // namespace cubevec::cli
