// Processor actor of the CPU executor (one host thread each; the GPU's processor is a block, in
// runtime/cuda/persistent_kernel.cuh) and the subscriber actor, the same on both.
#pragma once

#include "runtime/context.hpp"
#include "scheduler/ready_list.hpp"

namespace loom {

// A decoder for pipelines without arrivals to decode.
struct NoDecoder {
  LOOM_HD bool poll(TaskContext&, std::uint32_t, std::uint32_t) { return false; }
};

template <class Pipeline, class Policy>
void run_processor_host(RuntimeState const& s, std::uint32_t me, SymmetricView const& heap) {
  WaiterId const who{Actor::processor, me, s.rank};
  std::uint64_t const epoch = load_acquire(s.counters->epoch.value);
  Doorbell& bell = s.doorbells[me];
  // An idle processor is bounded by the launch's heartbeat; the scheduler's watchdog, at half this
  // bound, reports a stalled launch first and with more to say.
  Watchdog bell_dog(*s.error, who, 2 * s.watchdog_ns, WaitSite::doorbell, me);
  Watchdog push_dog(*s.error, who, s.watchdog_ns, WaitSite::queue_slot, s.ready.id);
  TaskContext ctx(s, epoch, who, heap, nullptr);
  TaskRef body_kept = kStopRef;  // a task the body emitted and kept to run next
  ctx.offer_keep(&body_kept);
  ProcessorLink link = ProcessorLink::start(me);
  take_start_root(s, link, start_root<Policy>(s, me));
  for (;;) {
    TaskRef ref = kStopRef;
    std::uint64_t const asked = s.trace ? now_ns() : 0;
    if (!take_next_task(s, link, bell, bell_dog, ref) || ref == kStopRef) return;
    give_prefetch_credit(s, link);
    Task const task = s.task(ref);
    std::uint64_t const start = s.trace ? now_ns() : 0;
    ctx.set_task_type(task.header.type);
    if (!Pipeline::run_host(task, ctx) || has_error(*s.error)) return;
    record_trace(s, task, me, asked, start);
    TaskRef const kept = body_kept;
    body_kept = kStopRef;
    if (!finish_task(s, link, task, epoch, who, push_dog,
                     Policy::local_dispatch && kept == kStopRef))
      return;
    if (kept != kStopRef) link.kept = kept;
  }
}

// A subscriber: polls the application's decoder until the scheduler ends the launch. Host thread
// on the CPU executor, lane 0 of a subscriber warp on the GPU.
template <class Decoder>
LOOM_HD void run_subscriber(RuntimeState const& s, std::uint32_t index, Decoder& decoder,
                            SymmetricView const& heap) {
  WaiterId const who{Actor::subscriber, index, s.rank};
  std::uint64_t const epoch = load_acquire(s.counters->epoch.value);
  fetch_add_acq_rel(s.counters->subscribers_in.value, std::uint64_t{1});
  Watchdog dog(*s.error, who, 2 * s.watchdog_ns, WaitSite::subscriber_poll, index);
  Heartbeat beat(&s.counters->beat.value);
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
