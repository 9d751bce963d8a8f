#include "runtime/trace.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <sstream>

#include "runtime/error.hpp"

namespace loom {

namespace {

std::string type_name(std::uint16_t type, char const* const* type_names, std::uint32_t type_count) {
  return type < type_count ? type_names[type] : "type " + std::to_string(type);
}

std::uint64_t median_of(std::vector<std::uint64_t>& v) {
  if (v.empty()) return 0;
  auto const mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

}  // namespace

std::string chrome_trace_json(std::vector<TraceRecord> const& records,
                              char const* const* type_names, std::uint32_t type_count,
                              char const* const* mark_names, std::uint32_t mark_count) {
  std::uint64_t origin = ~std::uint64_t{0};
  for (auto const& r : records) origin = std::min(origin, r.start_ns);
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(3);
  os << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first = true;
  for (auto const& r : records) {
    if (!first) os << ",";
    first = false;
    if (is_trace_mark(r)) {
      std::uint16_t const kind = r.type & ~kTraceMark;
      std::uint32_t const track = (r.processor & kTraceBySubscriber) != 0
                                      ? 1000000 + (r.processor & ~kTraceBySubscriber)
                                      : r.processor;
      os << "\n{\"name\":\""
         << (kind < mark_count ? std::string(mark_names[kind]) : "mark " + std::to_string(kind))
         << "\",\"cat\":\"mark\",\"ph\":\"i\",\"s\":\"t\",\"pid\":" << r.rank
         << ",\"tid\":" << track << ",\"ts\":" << (r.start_ns - origin) / 1000.0
         << ",\"args\":{\"a\":" << r.task_id << ",\"b\":" << r.wait_ns << "}}";
      continue;
    }
    std::string const name = type_name(r.type, type_names, type_count);
    os << "\n{\"name\":\"" << name << "\",\"cat\":\"task\",\"ph\":\"X\",\"pid\":" << r.rank
       << ",\"tid\":" << r.processor << ",\"ts\":" << (r.start_ns - origin) / 1000.0
       << ",\"dur\":" << (r.end_ns - r.start_ns) / 1000.0 << ",\"args\":{\"task_id\":" << r.task_id
       << ",\"wait_us\":" << r.wait_ns / 1000.0 << "}}";
  }
  os << "\n]}\n";
  return os.str();
}

std::vector<TraceTypeSummary> summarize_trace(std::vector<TraceRecord> const& all) {
  std::vector<TraceRecord> records;
  records.reserve(all.size());
  std::copy_if(all.begin(), all.end(), std::back_inserter(records),
               [](TraceRecord const& r) { return !is_trace_mark(r); });
  if (records.empty()) return {};
  std::uint64_t origin = ~std::uint64_t{0};
  for (auto const& r : records) origin = std::min(origin, r.start_ns);
  // Each track's tasks in start order, for the gap before each.
  std::vector<std::size_t> order(records.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    TraceRecord const& x = records[a];
    TraceRecord const& y = records[b];
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.processor != y.processor) return x.processor < y.processor;
    return x.start_ns < y.start_ns;
  });
  struct Acc {
    TraceTypeSummary s{};
    std::vector<std::uint64_t> waits, gaps;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> by_start;  // (start, duration)
  };
  std::size_t tracks = 0;
  std::vector<Acc> by_type;
  std::vector<int> slot;  // type -> index in by_type, -1 while unseen
  for (std::size_t k = 0; k < order.size(); ++k) {
    TraceRecord const& r = records[order[k]];
    if (r.type >= slot.size()) slot.resize(std::size_t{r.type} + 1, -1);
    if (slot[r.type] < 0) {
      slot[r.type] = static_cast<int>(by_type.size());
      by_type.emplace_back();
      by_type.back().s.type = r.type;
      by_type.back().s.first_start_ns = ~std::uint64_t{0};
    }
    Acc& a = by_type[static_cast<std::size_t>(slot[r.type])];
    std::uint64_t const start = r.start_ns - origin, end = r.end_ns - origin;
    ++a.s.count;
    a.s.first_start_ns = std::min(a.s.first_start_ns, start);
    a.s.last_start_ns = std::max(a.s.last_start_ns, start);
    a.s.last_end_ns = std::max(a.s.last_end_ns, end);
    a.waits.push_back(r.wait_ns);
    a.by_start.emplace_back(r.start_ns, r.end_ns - r.start_ns);
    a.s.busy_ns += r.end_ns - r.start_ns;
    TraceRecord const* const p = k > 0 ? &records[order[k - 1]] : nullptr;
    if (p && p->rank == r.rank && p->processor == r.processor)
      a.gaps.push_back(r.start_ns > p->end_ns ? r.start_ns - p->end_ns : 0);
    else
      ++tracks;
  }
  std::vector<TraceTypeSummary> out;
  for (Acc& a : by_type) {
    a.s.median_wait_ns = median_of(a.waits);
    a.s.gapped = static_cast<std::uint32_t>(a.gaps.size());
    a.s.median_gap_ns = median_of(a.gaps);
    std::sort(a.by_start.begin(), a.by_start.end());
    std::size_t const wave = std::min(tracks, a.by_start.size());
    std::vector<std::uint64_t> first, later;
    for (std::size_t i = 0; i < a.by_start.size(); ++i)
      (i < wave ? first : later).push_back(a.by_start[i].second);
    a.s.first_wave = static_cast<std::uint32_t>(wave);
    a.s.first_wave_median_ns = median_of(first);
    a.s.later_median_ns = median_of(later);
    first.insert(first.end(), later.begin(), later.end());
    a.s.median_ns = median_of(first);
    a.s.tracks = static_cast<std::uint32_t>(tracks);
    out.push_back(a.s);
  }
  std::stable_sort(out.begin(), out.end(), [](auto const& x, auto const& y) {
    return x.first_start_ns < y.first_start_ns;
  });
  return out;
}

std::string format_trace_summary(std::vector<TraceTypeSummary> const& summary,
                                 char const* const* type_names, std::uint32_t type_count) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  std::string head = "type";
  head.resize(20, ' ');
  os << head << " " << std::setw(8) << "tasks" << std::setw(16) << "first start" << std::setw(14)
     << "last start" << std::setw(14) << "last end" << std::setw(10) << "median" << std::setw(15)
     << "median wait" << std::setw(14) << "median gap" << std::setw(15) << "first wave"
     << std::setw(11) << "later" << std::setw(12) << "busy"
     << "\n";
  for (auto const& t : summary) {
    std::string name = type_name(t.type, type_names, type_count);
    name.resize(std::max<std::size_t>(name.size(), 20), ' ');
    os << name << " " << std::setw(8) << t.count << std::setw(13) << t.first_start_ns / 1000.0
       << " us" << std::setw(11) << t.last_start_ns / 1000.0 << " us" << std::setw(11)
       << t.last_end_ns / 1000.0 << " us" << std::setw(7) << t.median_ns / 1000.0 << " us"
       << std::setw(12) << t.median_wait_ns / 1000.0 << " us";
    if (t.gapped != 0)
      os << std::setw(11) << t.median_gap_ns / 1000.0 << " us";
    else
      os << std::setw(14) << "-";
    os << std::setw(12) << t.first_wave_median_ns / 1000.0 << " us";
    if (t.count > t.first_wave)
      os << std::setw(8) << t.later_median_ns / 1000.0 << " us";
    else
      os << std::setw(11) << "-";
    os << std::setw(9) << std::setprecision(2) << t.busy_ns / 1e6 << " ms" << std::setprecision(1)
       << "\n";
  }
  if (summary.empty()) return os.str();
  std::uint64_t span = 0, busy = 0;
  for (auto const& t : summary) span = std::max(span, t.last_end_ns), busy += t.busy_ns;
  double const capacity = static_cast<double>(span) * summary.front().tracks;
  os << "processors: " << summary.front().tracks << " tracks over " << span / 1000.0 << " us: busy "
     << std::setprecision(2) << busy / 1e6 << " ms of " << capacity / 1e6 << " ms ("
     << std::setprecision(1) << (capacity > 0 ? 100.0 * busy / capacity : 0.0) << "%), idle "
     << std::setprecision(2) << (capacity - static_cast<double>(busy)) / 1e6 << " ms\n";
  return os.str();
}

void write_chrome_trace(std::string const& path, std::vector<TraceRecord> const& records,
                        char const* const* type_names, std::uint32_t type_count,
                        char const* const* mark_names, std::uint32_t mark_count) {
  std::ofstream out(path);
  if (!out) throw Error("loom: cannot open trace file '" + path + "' for writing");
  out << chrome_trace_json(records, type_names, type_count, mark_names, mark_count);
  if (!out) throw Error("loom: writing trace file '" + path + "' failed");
}

}  // namespace loom
