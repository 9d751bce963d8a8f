// Chrome-trace (Perfetto-readable) export of per-task records: one complete event ("ph":"X") per
// task, on a track per (rank, processor).
#pragma once

#include <string>
#include <vector>

#include "runtime/state.hpp"

namespace loom {

// Writes `records` as Chrome-trace JSON; `type_names` names the task types. Throws on I/O error.
void write_chrome_trace(std::string const& path, std::vector<TraceRecord> const& records,
                        char const* const* type_names, std::uint32_t type_count);

std::string chrome_trace_json(std::vector<TraceRecord> const& records,
                              char const* const* type_names, std::uint32_t type_count);

}  // namespace loom
