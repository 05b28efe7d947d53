// The hybrid runtime's named choices (--accel, --policy, --cache, --prefetch): read from the
// command line (or a caller's options) once, by parse_choice, and carried as enums from there on;
// choice_name gives the word back for summaries, JSON and logs.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace tandem::rt {

// Where the MoE layers' accelerator work runs: auto (cuda where the build and a GPU allow it
// once tested on one, else none), none (CPU only), host (the emulated device), cuda.
enum class Accel { kAuto, kNone, kHost, kCuda };
// Which experts run on the accelerator each layer (runtime/policy.h).
enum class PolicyKind { kStatic, kFiddler, kHybriMoe, kDali, kOptimal };
// How the accelerator's expert slots are kept (runtime/expert_cache.h).
enum class CacheKind { kLru, kLfu, kMrs, kDali, kNone };
// What is copied ahead for the next MoE layer (runtime/prefetch.h).
enum class PrefetchKind { kNone, kGate, kResidual };

// Per enum: its flag and its words in the order the help lists them.
template <class E>
struct Choices;
template <>
struct Choices<Accel> {
  static constexpr const char* kFlag = "--accel";
  static constexpr std::array<std::pair<Accel, std::string_view>, 4> kWords{{
      {Accel::kAuto, "auto"}, {Accel::kNone, "none"}, {Accel::kHost, "host"}, {Accel::kCuda, "cuda"}}};
};
template <>
struct Choices<PolicyKind> {
  static constexpr const char* kFlag = "--policy";
  static constexpr std::array<std::pair<PolicyKind, std::string_view>, 5> kWords{
      {{PolicyKind::kStatic, "static"},
       {PolicyKind::kFiddler, "fiddler"},
       {PolicyKind::kHybriMoe, "hybrimoe"},
       {PolicyKind::kDali, "dali"},
       {PolicyKind::kOptimal, "optimal"}}};
};
template <>
struct Choices<CacheKind> {
  static constexpr const char* kFlag = "--cache";
  static constexpr std::array<std::pair<CacheKind, std::string_view>, 5> kWords{
      {{CacheKind::kLru, "lru"},
       {CacheKind::kLfu, "lfu"},
       {CacheKind::kMrs, "mrs"},
       {CacheKind::kDali, "dali"},
       {CacheKind::kNone, "none"}}};
};
template <>
struct Choices<PrefetchKind> {
  static constexpr const char* kFlag = "--prefetch";
  static constexpr std::array<std::pair<PrefetchKind, std::string_view>, 3> kWords{
      {{PrefetchKind::kNone, "none"}, {PrefetchKind::kGate, "gate"}, {PrefetchKind::kResidual, "residual"}}};
};

// "a | b | c": the words, for help texts and errors.
template <class E>
std::string choice_words() {
  std::string all;
  for (const auto& [value, word] : Choices<E>::kWords) {
    if (!all.empty()) all += " | ";
    all += word;
  }
  return all;
}

template <class E>
std::string_view choice_name(E value) {
  for (const auto& [v, word] : Choices<E>::kWords) {
    if (v == value) return word;
  }
  return "?";
}

// The enum a word names; Error(kInvalidArgument) "<flag> '<word>' is not one of: a | b | c".
template <class E>
E parse_choice(std::string_view word) {
  for (const auto& [value, w] : Choices<E>::kWords) {
    if (w == word) return value;
  }
  fail(ErrorKind::kInvalidArgument, "{} '{}' is not one of: {}", Choices<E>::kFlag, word,
       choice_words<E>());
}

}  // namespace tandem::rt
