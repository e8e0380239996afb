#include "pipelines/prompt_embeds_file.h"

#include "base/error.h"
#include "tensor/finite_check.h"
#include "tensor/safetensors.h"

namespace cubevec::pipelines {

PromptEmbedsFile PromptEmbedsFile::load(const std::string& path, bool with_pooled) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  auto find = [&](std::initializer_list<const char*> names, int rank_without_batch, bool required) -> Tensor {
    for (const char* name : names) {
      if (!file.contains(name)) continue;
      Tensor t = file.tensor(name);
      if (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && t.dtype() != DType::f16)
        throw Error(path + ": '" + name + "' must be f32, bf16 or f16, got " + std::string(dtype_name(t.dtype())));
      if (t.dim() == rank_without_batch) t = t.unsqueeze(0);
      if (t.dim() != rank_without_batch + 1 || t.size(0) != 1)
        throw Error(path + ": '" + name + "' must be " + (rank_without_batch == 2 ? "[1, L, D] (or [L, D])" : "[1, P] (or [P])") +
                    ", got " + shape_to_string(t.shape()));
      for (int64_t d = 1; d < t.dim(); ++d)
        if (t.size(d) == 0)
          throw Error(path + ": '" + name + "' " + shape_to_string(t.shape()) + " is empty (it needs at least one token and width)");
      require_finite(t, path + ": '" + std::string(name) + "'");
      return t;
    }
    if (required) {
      std::string list;
      for (const char* name : names) list += (list.empty() ? "'" : " or '") + std::string(name) + "'";
      throw Error(path + ": no " + list + " tensor (a --prompt-embeds file holds prompt_embeds [1, L, D]" +
                  (with_pooled ? " and pooled_prompt_embeds [1, P])" : ")"));
    }
    return {};
  };
  PromptEmbedsFile out;
  out.positive.sequence = find({"prompt_embeds", "encoder_hidden_states"}, 2, true);
  if (!with_pooled) {
    // Wan: one sequence per prompt, no pooled vector.
    const Tensor neg = find({"negative_prompt_embeds"}, 2, false);
    if (neg.defined()) {
      if (neg.size(2) != out.positive.sequence.size(2))
        throw Error(path + ": the negative embeddings " + shape_to_string(neg.shape()) + " must have the width of the positive ones " +
                    shape_to_string(out.positive.sequence.shape()));
      out.negative = PromptEmbeddings{neg, {}};
    }
    return out;
  }
  out.positive.pooled = find({"pooled_prompt_embeds", "pooled_projections"}, 1, true);
  const Tensor neg = find({"negative_prompt_embeds"}, 2, false);
  const Tensor neg_pooled = find({"negative_pooled_prompt_embeds"}, 1, false);
  if (neg.defined() != neg_pooled.defined())
    throw Error(path + ": negative_prompt_embeds and negative_pooled_prompt_embeds must come together");
  if (neg.defined()) {
    if (neg.size(2) != out.positive.sequence.size(2) || neg_pooled.size(1) != out.positive.pooled.size(1))
      throw Error(path + ": the negative embeddings " + shape_to_string(neg.shape()) + " / " + shape_to_string(neg_pooled.shape()) +
                  " must have the widths of the positive ones " + shape_to_string(out.positive.sequence.shape()) + " / " +
                  shape_to_string(out.positive.pooled.shape()));
    out.negative = PromptEmbeddings{neg, neg_pooled};
  }
  return out;
}

}  // namespace cubevec::pipelines
