#include "cli/device_flags.h"
#include "cli/range_flag.h"

namespace cubevec::cli {

DeviceProfile DeviceFlags::resolve() const {
  DeviceProfile profile = profile_path.empty() ? builtin_cpu_profile() : load_device_profile(profile_path);
  apply_thread_overrides(profile, cube_threads, vector_threads);
  return profile;
}

std::shared_ptr<DeviceFlags> add_device_flags(CLI::App& command) {
  auto flags = std::make_shared<DeviceFlags>();
  // An empty path would read as "not given" and run the built-in profile instead of the one meant.
  command
      .add_option("--device-profile", flags->profile_path,
                  "Device profile JSON (e.g. assets/devices/ascend-910b.json); default: built-in cpu-default")
      ->check(CLI::Validator(
          [](const std::string& text) {
            return text.empty() ? std::string("expected a device profile JSON file, got an empty path") : std::string();
          },
          "FILE"));
  command.add_option("--cube-threads", flags->cube_threads, "Threads of the Cube unit (overrides the profile)")->check(in_range(1, 4096));
  command.add_option("--vector-threads", flags->vector_threads, "Threads of the Vector unit (overrides the profile)")
      ->check(in_range(1, 4096));
  return flags;
}

}  // namespace cubevec::cli
