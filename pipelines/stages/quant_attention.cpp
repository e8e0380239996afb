#include "pipelines/stages/quant_attention.h"

#include "base/enum_names.h"
#include "base/error.h"
#include "ops/attention.h"

namespace cubevec::pipelines {

namespace {
constexpr auto kQuantNames =
    enum_names<AttentionQuant>("attention quantization", {{AttentionQuant::none, "none"}, {AttentionQuant::int8, "int8"}});
}  // namespace

AttentionQuant parse_attention_quant(std::string_view name, const std::string& source) {
  try {
    return kQuantNames.parse(name);
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
}

std::string_view attention_quant_name(AttentionQuant quant) { return kQuantNames.name(quant); }

QuantAttentionStage::QuantAttentionStage(AttentionQuant quant, bool simulate) : quant_(quant) {
  if (quant_ == AttentionQuant::int8 && !simulate && !ops::attention_impl_available(ops::AttentionImpl::flash_int8))
    throw Error(
        "--quant-attention int8 needs AMX-INT8 (or AVX512-VNNI with AVX512-BF16) for int8 attention's products, which this CPU (or its "
        "kernel) does not offer");
}

Tensor int8_attention(const models::AttentionQkv& qkv, const Stream& stream) {
  ops::AttentionOptions o;
  o.opt_mode = ops::AttentionOptMode::manual;
  o.op_type = ops::AttentionImpl::flash_int8;
  o.kernel_layout = ops::AttentionLayout::bsnd;  // the kernel reads strided rows: no transposed copy
  const Tensor out = ops::attention_forward(qkv.q, qkv.k, qkv.v, o, stream);
  return out.reshape({out.size(0), out.size(1), out.size(2) * out.size(3)});
}

void QuantAttentionStage::begin_run(const RunInfo& /*run*/) { calls_ = 0; }

Tensor QuantAttentionStage::attend(const models::StepInfo& /*step*/, const models::AttentionIdentity& /*id*/,
                                   const models::AttentionProjection& project, const Stream& stream, const AttendNext& next) {
  if (quant_ == AttentionQuant::none) return next(project);
  const Tensor out = int8_attention(project(), stream);
  ++calls_;
  return out;
}

std::string QuantAttentionStage::summary() const { return std::to_string(calls_) + " attention calls in int8"; }

nlohmann::ordered_json QuantAttentionStage::report() const {
  return {{"quant_attention", std::string(attention_quant_name(quant_))}, {"int8_calls", calls_}};
}

}  // namespace cubevec::pipelines
