// The device flags every kernel-running subcommand shares: --device-profile, --cube-threads,
// --vector-threads (which beat CUBEVEC_CUBE_THREADS / CUBEVEC_VECTOR_THREADS).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "device/device_profile.h"

namespace cubevec::cli {

struct DeviceFlags {
  std::string profile_path;  // empty: the built-in cpu-default profile
  int cube_threads = 0;      // 0: keep the profile's (or the environment's)
  int vector_threads = 0;

  DeviceProfile resolve() const;
};

std::shared_ptr<DeviceFlags> add_device_flags(CLI::App& command);

}  // namespace cubevec::cli
