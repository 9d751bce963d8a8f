// Seeds of the suites' random inputs, host and GPU alike: fresh in every test, named in every
// failure, and replayable (LOOM_TEST_SEED=<n> fixes them all).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace loom::test {

inline std::uint32_t fresh_seed() {
  if (char const* fixed = std::getenv("LOOM_TEST_SEED"))
    return static_cast<std::uint32_t>(std::strtoul(fixed, nullptr, 10));
  return std::random_device{}();
}
inline std::string seed_trace(std::uint32_t seed) {
  return "seed " + std::to_string(seed) + " (replay with LOOM_TEST_SEED=" + std::to_string(seed) +
         ")";
}

// A fresh seed whose trace names it in every failure while it lives: declare it in the scope
// whose failures it should name (a test body, or a fixture or helper object living there), since
// a gtest trace is popped when its holder goes.
class TracedSeed {
 public:
  operator std::uint32_t() const { return value_; }

 private:
  std::uint32_t value_ = fresh_seed();
  ::testing::ScopedTrace trace_{__FILE__, __LINE__, seed_trace(value_)};
};

}  // namespace loom::test
