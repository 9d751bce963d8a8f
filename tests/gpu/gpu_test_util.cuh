// Shared by the GPU suites: skip cleanly where there is no GPU.
#pragma once

#include <gtest/gtest.h>

#include "runtime/cuda/check.hpp"

#define LOOM_REQUIRE_GPU()                                          \
  do {                                                              \
    if (::loom::cuda_device_count() == 0) GTEST_SKIP() << "no GPU"; \
  } while (0)
