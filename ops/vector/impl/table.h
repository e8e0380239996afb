// The kernel table of one ISA: every ops/vector/isa_*.cpp includes this and returns kTable.
#pragma once

#include "ops/vector/impl/activation_kernels.h"
#include "ops/vector/impl/elementwise_kernels.h"
#include "ops/vector/impl/norm_kernels.h"
#include "ops/vector/impl/quantize_kernels.h"
#include "ops/vector/impl/rope_kernels.h"

namespace cubevec::ops::vk {
namespace {

void rms_norm_entry(const RowArgs& a, int64_t r0, int64_t r1) {
  if (a.type == Elem::f32) rms_norm_rows<float>(a, r0, r1);
  else rms_norm_rows<bf16_t>(a, r0, r1);
}

void layer_norm_entry(const RowArgs& a, int64_t r0, int64_t r1) {
  if (a.type == Elem::f32) layer_norm_rows<float>(a, r0, r1);
  else layer_norm_rows<bf16_t>(a, r0, r1);
}

void softmax_entry(const RowArgs& a, int64_t r0, int64_t r1) {
  if (a.type == Elem::f32) softmax_rows<float>(a, r0, r1);
  else softmax_rows<bf16_t>(a, r0, r1);
}

void group_norm_entry(const GroupNormArgs& a, int64_t g0, int64_t g1) {
  if (a.type == Elem::f32) group_norm_groups<float>(a, g0, g1);
  else group_norm_groups<bf16_t>(a, g0, g1);
}

void rope_entry(const RopeArgs& a, int64_t r0, int64_t r1) {
  if (a.type == Elem::f32) rope_rows<float>(a, r0, r1);
  else rope_rows<bf16_t>(a, r0, r1);
}

void unary_entry(const UnaryArgs& a, int64_t i0, int64_t i1) {
  if (a.type == Elem::f32) unary_range<float>(a, i0, i1);
  else unary_range<bf16_t>(a, i0, i1);
}

void binary_entry(const BinaryArgs& a, int64_t r0, int64_t r1) {
  if (a.type == Elem::f32) binary_rows<float>(a, r0, r1);
  else binary_rows<bf16_t>(a, r0, r1);
}

void convert_entry(const ConvertArgs& a, int64_t i0, int64_t i1) {
  if (a.from == Elem::f32 && a.to == Elem::f32) convert_range<float, float>(a, i0, i1);
  else if (a.from == Elem::f32) convert_range<float, bf16_t>(a, i0, i1);
  else if (a.to == Elem::f32) convert_range<bf16_t, float>(a, i0, i1);
  else convert_range<bf16_t, bf16_t>(a, i0, i1);
}

void channel_norm_entry(const ChannelNormArgs& a, int64_t i0, int64_t i1) {
  if (a.type == Elem::f32) channel_norm_blocks<float>(a, i0, i1);
  else channel_norm_blocks<bf16_t>(a, i0, i1);
}

void quantize_entry(const QuantizeArgs& a, int64_t r0, int64_t r1) {
  if (a.type == Elem::f32) quantize_rows<float>(a, r0, r1);
  else quantize_rows<bf16_t>(a, r0, r1);
}

constexpr Kernels kTable = {rms_norm_entry, layer_norm_entry, softmax_entry, group_norm_entry,   rope_entry,
                            unary_entry,    binary_entry,     convert_entry, channel_norm_entry, quantize_entry};

}  // namespace
}  // namespace cubevec::ops::vk
