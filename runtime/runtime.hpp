// Everything a host program needs to build graphs and run pipelines on the CPU executor.
#pragma once

#include "runtime/cpu_executor.hpp"
#include "runtime/graph.hpp"
#include "runtime/pipeline.hpp"
#include "runtime/tiles.hpp"
#include "runtime/trace.hpp"
