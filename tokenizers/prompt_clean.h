// WanPipeline's prompt_clean, which runs on every prompt (and the negative prompt) before umT5's
// tokenizer, on a machine without ftfy: HTML entities decoded twice exactly as Python's
// html.unescape does (the HTML5 named references with the standard's longest-prefix rule for names
// without ';', numeric references with CP-1252 for 0x80-0x9F, U+FFFD for surrogates and values
// beyond U+10FFFF, and the code points Python drops), stripped, every run of Unicode White_Space
// made one ' ', stripped again.
#pragma once

#include <string>

namespace cubevec::tokenizers {

// Throws naming `what` when `prompt` is not UTF-8.
std::string html_unescape(const std::string& text, const std::string& what = "the prompt");
std::string wan_prompt_clean(const std::string& prompt, const std::string& what = "the prompt");

}  // namespace cubevec::tokenizers
