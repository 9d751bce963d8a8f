// The per-type summary of a trace (runtime/trace.hpp): counts, windows, medians of durations and
// waits, and the gap before each task on its own track, on hand-made records and on a launch of
// the CPU executor.
#include "runtime/trace.hpp"

#include <set>
#include <string>

#include "tests/cpu/test_graphs.hpp"

namespace loom::test {
namespace {

// A record of `type` on (rank, processor), times in µs after 1000 µs.
TraceRecord rec(std::uint16_t type, std::uint16_t rank, std::uint32_t processor,
                std::uint64_t start_us, std::uint64_t end_us, std::uint32_t wait_us) {
  return TraceRecord{
      (1000 + start_us) * 1000, (1000 + end_us) * 1000, processor, type, rank, 0, wait_us * 1000};
}

TEST(TraceSummary, CountsWindowsMediansAndGapsPerTrack) {
  // Type 2 runs first on both processors of rank 0; type 0 follows on each; processor 0 of
  // rank 1 runs one task of type 0 whose only predecessor on the same processor number is on
  // another rank (no gap for it).
  std::vector<TraceRecord> const records = {
      rec(0, 0, 0, 14, 20, 3),  // after type 2 on (0, 0): gap 4
      rec(2, 0, 1, 1, 9, 1),    //
      rec(2, 0, 0, 0, 10, 0),   //
      rec(0, 0, 1, 10, 30, 1),  // after type 2 on (0, 1): gap 1
      rec(0, 1, 0, 5, 12, 5),   // first on (1, 0)
      rec(0, 0, 0, 22, 24, 2),  // after type 0 on (0, 0): gap 2
  };
  std::vector<TraceTypeSummary> const s = summarize_trace(records);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].type, 2u);  // first start 0 µs
  EXPECT_EQ(s[0].count, 2u);
  EXPECT_EQ(s[0].first_start_ns, 0u);
  EXPECT_EQ(s[0].last_start_ns, 1000u);
  EXPECT_EQ(s[0].last_end_ns, 10000u);
  EXPECT_EQ(s[0].median_ns, 10000u);  // durations 8 and 10 µs: the upper middle
  EXPECT_EQ(s[0].median_wait_ns, 1000u);
  EXPECT_EQ(s[0].gapped, 0u);
  EXPECT_EQ(s[0].median_gap_ns, 0u);

  EXPECT_EQ(s[1].type, 0u);
  EXPECT_EQ(s[1].count, 4u);
  EXPECT_EQ(s[1].first_start_ns, 5000u);
  EXPECT_EQ(s[1].last_start_ns, 22000u);
  EXPECT_EQ(s[1].last_end_ns, 30000u);
  EXPECT_EQ(s[1].median_ns, 7000u);       // durations 6, 20, 7, 2 µs
  EXPECT_EQ(s[1].median_wait_ns, 3000u);  // waits 3, 1, 5, 2 µs
  EXPECT_EQ(s[1].gapped, 3u);
  EXPECT_EQ(s[1].median_gap_ns, 2000u);  // gaps 4, 1, 2 µs
  // Three tracks: the first wave is each type's first three tasks by start.
  EXPECT_EQ(s[0].first_wave, 2u);
  EXPECT_EQ(s[0].first_wave_median_ns, 10000u);
  EXPECT_EQ(s[0].later_median_ns, 0u);
  EXPECT_EQ(s[1].first_wave, 3u);
  EXPECT_EQ(s[1].first_wave_median_ns, 7000u);  // starts 5, 10, 14: durations 7, 20, 6 µs
  EXPECT_EQ(s[1].later_median_ns, 2000u);       // start 22: 2 µs

  // Processor time: 8 + 10 and 6 + 20 + 7 + 2 µs on three tracks over 30 µs (90 µs), 53 busy.
  EXPECT_EQ(s[0].busy_ns, 18000u);
  EXPECT_EQ(s[1].busy_ns, 35000u);
  EXPECT_EQ(s[0].tracks, 3u);
  EXPECT_EQ(s[1].tracks, 3u);

  char const* const names[] = {"zero", "one", "two"};
  std::string const table = format_trace_summary(s, names, 3);
  EXPECT_NE(table.find("processors: 3 tracks over 30.0 us: busy 0.05 ms of 0.09 ms (58.9%), idle "
                       "0.04 ms"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("two"), std::string::npos);
  EXPECT_NE(table.find("zero"), std::string::npos);
  EXPECT_LT(table.find("two"), table.find("zero"));  // in order of first start
  EXPECT_TRUE(summarize_trace({}).empty());
}

TEST(TraceSummary, SeparatesTheFirstWaveFromTheRest) {
  // Two tracks, five tasks of one type: the two that start first are the first wave, slower.
  std::vector<TraceRecord> const records = {
      rec(1, 0, 0, 0, 30, 0),   // first wave
      rec(1, 0, 1, 1, 29, 0),   // first wave
      rec(1, 0, 0, 31, 41, 0),  //
      rec(1, 0, 1, 30, 42, 0),  //
      rec(1, 0, 0, 42, 53, 0),  //
  };
  std::vector<TraceTypeSummary> const s = summarize_trace(records);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first_wave, 2u);
  EXPECT_EQ(s[0].first_wave_median_ns, 30000u);  // 30 and 28 µs: the upper middle
  EXPECT_EQ(s[0].later_median_ns, 11000u);       // 10, 12, 11 µs
  char const* const names[] = {"zero", "one"};
  std::string const table = format_trace_summary(s, names, 2);
  EXPECT_NE(table.find("first wave"), std::string::npos);
  EXPECT_NE(table.find("30.0 us"), std::string::npos);
  EXPECT_NE(table.find("11.0 us"), std::string::npos);
}

// Marks (kTraceMark) stay out of the summary and become instant events in the JSON, on their
// processor's track or, from a subscriber, on track 1000000 + its index.
TEST(TraceSummary, MarksAreInstantsOutsideTheSummary) {
  std::vector<TraceRecord> records = {rec(1, 0, 0, 0, 10, 0), rec(1, 0, 1, 2, 8, 0)};
  TraceRecord mark = rec(kTraceMark | 1, 0, 1, 5, 5, 0);
  mark.task_id = 7;
  mark.wait_ns = 42;
  records.push_back(mark);
  mark.type = kTraceMark | 3;
  mark.processor = kTraceBySubscriber | 1;
  records.push_back(mark);
  EXPECT_TRUE(is_trace_mark(records[2]));
  EXPECT_FALSE(is_trace_mark(records[0]));
  std::vector<TraceTypeSummary> const s = summarize_trace(records);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].count, 2u);
  EXPECT_EQ(s[0].tracks, 2u);
  char const* const types[] = {"zero", "one"};
  char const* const marks[] = {"m0", "m1"};
  std::string const json = chrome_trace_json(records, types, 2, marks, 2);
  EXPECT_NE(json.find("{\"name\":\"m1\",\"cat\":\"mark\",\"ph\":\"i\",\"s\":\"t\",\"pid\":0,"
                      "\"tid\":1,\"ts\":5.000,\"args\":{\"a\":7,\"b\":42}}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"name\":\"mark 3\",\"cat\":\"mark\",\"ph\":\"i\",\"s\":\"t\",\"pid\":0,"
                      "\"tid\":1000001"),
            std::string::npos)
      << json;
  EXPECT_EQ(json.find("\"name\":\"m1\",\"cat\":\"task\""), std::string::npos);
}

TEST(TraceSummary, CoversEveryTaskOfALaunch) {
  // 100 independent tasks then a chain of two: the same Stamp type, every task counted once.
  Recorder r(102);
  GraphBuilder b;
  EventId const e = b.add_event(100);
  for (std::uint32_t t = 0; t < 100; ++t) b.add_task(stamp_task(r, t, e));
  EventId const e2 = b.add_event(1);
  b.add_task(stamp_task(r, 100, e2), {e});
  b.add_task(stamp_task(r, 101), {e2});
  Graph const g = b.build();
  CpuOptions o = options_with(3);
  o.trace_capacity = 256;
  CpuExecutor<TestPipeline> ex(one_rank(g), o);
  ex.run();
  std::vector<TraceRecord> const trace = ex.take_trace(0);
  std::vector<TraceTypeSummary> const s = summarize_trace(trace);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].type, TestPipeline::id<Stamp>);
  EXPECT_EQ(s[0].count, 102u);
  std::uint64_t busy = 0;
  for (auto const& t : trace) busy += t.end_ns - t.start_ns;
  EXPECT_EQ(s[0].busy_ns, busy);
  EXPECT_EQ(s[0].first_start_ns, 0u);
  EXPECT_GE(s[0].last_end_ns, s[0].last_start_ns);
  std::set<std::uint32_t> tracks;  // one rank: a track per processor that ran a task
  for (TraceRecord const& t : trace) tracks.insert(t.processor);
  EXPECT_EQ(s[0].gapped, 102u - tracks.size());  // every task but each track's first
}

}  // namespace
}  // namespace loom::test
