// Reading small input files (JSON configs, descriptions, policies, indexes, pictures) safely:
// the path must name a regular file, checked before anything opens it (opening a FIFO blocks
// until a writer comes; /dev/zero never ends), and the file must fit a stated size.
#pragma once

#include <cstddef>
#include <string>

namespace cubevec {

inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{64} << 20;  // JSON files

// Throws "<path>: ..." unless `path` (symlinks followed) is an existing regular file: "cannot
// open: <reason>", "is a directory, not a file", "is not a regular file (a FIFO, socket or device)".
void require_regular_file(const std::string& path);

// Whether `path` (symlinks followed) is a folder (true) or nothing (false); anything else there (a
// file, a FIFO) throws "<path> is not a folder<suffix>". The caller words the missing case.
bool folder_exists(const std::string& path, const std::string& suffix = "");

// The whole file, after require_regular_file; more than max_bytes is an error naming both sizes.
std::string read_regular_file(const std::string& path, std::size_t max_bytes = kMaxConfigFileBytes);

}  // namespace cubevec
