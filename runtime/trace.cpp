#include "runtime/trace.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "runtime/error.hpp"

namespace loom {

std::string chrome_trace_json(std::vector<TraceRecord> const& records,
                              char const* const* type_names, std::uint32_t type_count) {
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
    std::string const name =
        r.type < type_count ? type_names[r.type] : "type " + std::to_string(r.type);
    os << "\n{\"name\":\"" << name << "\",\"cat\":\"task\",\"ph\":\"X\",\"pid\":" << r.rank
       << ",\"tid\":" << r.processor << ",\"ts\":" << (r.start_ns - origin) / 1000.0
       << ",\"dur\":" << (r.end_ns - r.start_ns) / 1000.0 << ",\"args\":{\"task_id\":" << r.task_id
       << ",\"wait_us\":" << r.wait_ns / 1000.0 << "}}";
  }
  os << "\n]}\n";
  return os.str();
}

void write_chrome_trace(std::string const& path, std::vector<TraceRecord> const& records,
                        char const* const* type_names, std::uint32_t type_count) {
  std::ofstream out(path);
  if (!out) throw Error("loom: cannot open trace file '" + path + "' for writing");
  out << chrome_trace_json(records, type_names, type_count);
  if (!out) throw Error("loom: writing trace file '" + path + "' failed");
}

}  // namespace loom
