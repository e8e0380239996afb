// The contract is one error line: line breaks become "; ", control characters and bytes that are
// not UTF-8 (from files, prompts, config keys) are shown as \xNN instead of reaching the terminal,
// and a message longer than 1,000 bytes (a pasted prompt echoed back) is cut, saying how much.
#pragma once

#include <string>

namespace cubevec::cli {

std::string one_line(const std::string& message);

}  // namespace cubevec::cli
