// Chrome-trace (Perfetto-readable) export of per-task records: one complete event ("ph":"X") per
// task, on a track per (rank, processor).
#pragma once

#include <string>
#include <vector>

#include "runtime/state.hpp"

namespace loom {

// Writes `records` as Chrome-trace JSON; `type_names` names the task types. Marks
// (is_trace_mark) become instant events ("ph":"i") with their values as args a and b, on the
// track of the processor that recorded them (a subscriber's on track 1000000 + its index), named
// by `mark_names` (kind < mark_count) or "mark <kind>". Throws on I/O error.
void write_chrome_trace(std::string const& path, std::vector<TraceRecord> const& records,
                        char const* const* type_names, std::uint32_t type_count,
                        char const* const* mark_names = nullptr, std::uint32_t mark_count = 0);

std::string chrome_trace_json(std::vector<TraceRecord> const& records,
                              char const* const* type_names, std::uint32_t type_count,
                              char const* const* mark_names = nullptr,
                              std::uint32_t mark_count = 0);

// One task type of a trace: how many of its tasks ran, when (ns after the trace's first task
// began: the first start, the last start, the last end), the median duration, the median wait
// (TraceRecord::wait_ns), and the median gap before it on its track (the end of the task its
// processor of the same rank ran before it, to its start; over the `gapped` tasks that had one).
// What happens between two tasks of a processor: the first's completion (its arrival and
// emissions), then the wait for the second.
struct TraceTypeSummary {
  std::uint16_t type;
  std::uint32_t count;
  std::uint64_t first_start_ns, last_start_ns, last_end_ns;
  std::uint64_t median_ns, median_wait_ns;
  std::uint32_t gapped;
  std::uint64_t median_gap_ns;  // 0 when gapped is 0
  // The type's first wave: its first `tracks` tasks by start (tracks: the trace's distinct
  // (rank, processor) pairs), and the median duration of those and of the rest (0 when none).
  std::uint32_t first_wave;
  std::uint64_t first_wave_median_ns, later_median_ns;
  // Processor time: the sum of the type's durations, and the trace's tracks (the same in every
  // type's summary), so that a table can set the busy time against the capacity.
  std::uint64_t busy_ns;
  std::uint32_t tracks;
};

// The task types of `records` (marks left out) in the order of their first start. Medians of an
// even count are the upper middle value.
std::vector<TraceTypeSummary> summarize_trace(std::vector<TraceRecord> const& records);

// The summary as a table, a line per type, times in µs (processor time in ms), then the use of
// the processors: busy and idle time against tracks x span (the span: the first start to the
// last end; on a trace of several ranks, the span of them all).
std::string format_trace_summary(std::vector<TraceTypeSummary> const& summary,
                                 char const* const* type_names, std::uint32_t type_count);

}  // namespace loom
