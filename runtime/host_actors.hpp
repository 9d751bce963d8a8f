// Processor and subscriber actors for the CPU executor: one host thread each, over the shared
// protocol. (The GPU's are in runtime/cuda/persistent_kernel.cuh.)
#pragma once

#include "runtime/context.hpp"

namespace loom {

// A decoder for pipelines without arrivals to decode.
struct NoDecoder {
  LOOM_HD bool poll(TaskContext&, std::uint32_t, std::uint32_t) { return false; }
};

template <class Pipeline>
void run_processor_host(RuntimeState const& s, std::uint32_t me, SymmetricView const& heap) {
  WaiterId const who{Actor::processor, me, s.rank};
  std::uint64_t const epoch = load_acquire(s.counters->epoch.value);
  Doorbell& bell = s.doorbells[me];
  std::uint64_t seen = load_relaxed(bell.rings);
  // An idle processor is bounded by the launch's heartbeat; the scheduler's watchdog, at half this
  // bound, reports a stalled launch first and with more to say.
  Watchdog bell_dog(*s.error, who, 2 * s.watchdog_ns, WaitSite::doorbell, me);
  Heartbeat beat(s.idle.tail);
  Watchdog push_dog(*s.error, who, s.watchdog_ns, WaitSite::queue_slot, s.idle.id);
  if (!queue_push(s.idle, me, push_dog)) return;
  for (;;) {
    TaskRef ref;
    if (!doorbell_wait(bell, seen, ref, beat, bell_dog) || ref == kStopRef) return;
    Task const task = s.task(ref);
    std::uint64_t const start = s.trace ? now_ns() : 0;
    TaskContext ctx(s, epoch, who, heap, nullptr);
    if (!Pipeline::run_host(task, ctx)) {
      raise_error(*s.error, ErrorCode::bad_task_type, Actor::processor, me, s.rank, 0,
                  task.header.type, Pipeline::size, task.header.type);
      return;
    }
    if (has_error(*s.error)) return;
    if (s.trace) {
      std::uint64_t const i = fetch_add_relaxed(*s.trace_count, std::uint64_t{1});
      if (i < s.trace_capacity)
        s.trace[i] = TraceRecord{start, now_ns(), me, task.header.type,
                                 static_cast<std::uint16_t>(s.rank), task.header.id, 0};
    }
    push_dog.reset();
    if (task.header.event != kNoEvent && !arrive(s, task.header.event, epoch, who, push_dog))
      return;
    if (!queue_push(s.idle, me | kCompletedBit, push_dog)) return;
  }
}

template <class Decoder>
void run_subscriber_host(RuntimeState const& s, std::uint32_t index, Decoder& decoder,
                         SymmetricView const& heap) {
  WaiterId const who{Actor::subscriber, index, s.rank};
  std::uint64_t const epoch = load_acquire(s.counters->epoch.value);
  fetch_add_acq_rel(s.counters->subscribers_in.value, std::uint64_t{1});
  Watchdog dog(*s.error, who, 2 * s.watchdog_ns, WaitSite::subscriber_poll, index);
  Heartbeat beat(s.idle.tail);
  TaskContext ctx(s, epoch, who, heap, nullptr);
  while (load_acquire(s.counters->stopped.value) < epoch) {
    if (decoder.poll(ctx, index, s.subscribers) || beat.moved()) {
      dog.reset();
    } else if (!dog.keep_waiting(epoch, load_relaxed(s.counters->stopped.value))) {
      return;
    }
  }
}

}  // namespace loom
