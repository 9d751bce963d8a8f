// What a task body (and a subscriber's decoder) may do besides computing: emit dynamic tasks,
// retire unused bound, arrive on events, reach the symmetric heap, and fail with a reported
// error. One type on host and device.
#pragma once

#include "runtime/protocol.hpp"
#include "runtime/symmetric.hpp"

namespace loom {

class TaskContext {
 public:
  LOOM_HD TaskContext(RuntimeState const& state, std::uint64_t epoch, WaiterId who,
                      SymmetricView const& heap, void* shared_memory)
      : state_(state), epoch_(epoch), who_(who), heap_(heap), shared_(shared_memory) {}

  LOOM_HD std::uint32_t rank() const { return state_.rank; }
  LOOM_HD std::uint32_t world() const { return state_.world; }
  LOOM_HD std::uint64_t epoch() const { return epoch_; }
  LOOM_HD std::uint32_t actor_index() const { return who_.block; }
  LOOM_HD SymmetricView const& heap() const { return heap_; }
  // Device: the block's dynamic shared memory (the pipeline's largest shared_bytes). Host: null.
  LOOM_HD void* shared_memory() const { return shared_; }

  // Emits a dynamic task; counted against the graph's dynamic bound. Device: one thread calls.
  LOOM_HD bool emit(Task const& task) const {
    Watchdog dog(*state_.error, who_, state_.watchdog_ns, WaitSite::queue_slot, state_.ready.id);
    return emit_task(state_, task, who_, dog);
  }
  // Emits n dynamic tasks make(0) .. make(n-1) at once (one bound check, one queue ticket per
  // chunk). Device: one thread calls. With keep_first, on a processor that offered a slot
  // (offer_keep) still empty, make(0) is not queued: the processor runs it next, after this body
  // and before any task the scheduler rings, on top of tasks already ready. For a body whose
  // emission opens a phase, so that its processor does not wait on the scheduler for the first
  // task of it.
  template <class MakeFn>
  LOOM_HD bool emit_many(std::uint32_t n, MakeFn make, bool keep_first = false) const {
    Watchdog dog(*state_.error, who_, state_.watchdog_ns, WaitSite::queue_slot, state_.ready.id);
    return emit_tasks(state_, n, make, who_, dog, keep_first ? keep_ : nullptr);
  }
  // The same, called by every thread of the block with the same n (device: emit_tasks_block,
  // one reservation for all n; host: emit_many). make(i) must be callable from any thread.
  template <class MakeFn>
  LOOM_HD bool emit_many_by_block(std::uint32_t n, MakeFn make, bool keep_first = false) const {
#if defined(__CUDA_ARCH__)
    Watchdog dog(*state_.error, who_, state_.watchdog_ns, WaitSite::queue_slot, state_.ready.id);
    return emit_tasks_block(state_, n, make, who_, dog, keep_first ? keep_ : nullptr);
#else
    return emit_many(n, make, keep_first);
#endif
  }
  // A shared emission of n tasks (runtime/protocol.hpp, SharedEmission): reserved by one thread
  // of one body, written by bodies running at once, each task once (emit_reserved). The first
  // `kept` are kept by the bodies that write them, one each. Device: one thread calls.
  LOOM_HD bool reserve_emission(std::uint32_t n, std::uint32_t kept, SharedEmission& out) const {
    return reserve_shared_emission(state_, n, kept, who_, out);
  }
  // Writes task k of a shared emission: queued at its place in the reservation's order, or,
  // below its `kept`, this processor's next task (its keep slot must be free). Device: any
  // thread, one per task.
  LOOM_HD bool emit_reserved(SharedEmission const& e, std::uint32_t k, Task const& task) const {
    Watchdog dog(*state_.error, who_, state_.watchdog_ns, WaitSite::queue_slot, state_.ready.id);
    return loom::emit_reserved(state_, e, k, task, who_, dog, keep_);
  }
  // Set by a processor: where a body's emit_many(..., keep_first) leaves the task it keeps
  // (kStopRef: none yet). Device: shared memory of the processor block.
  LOOM_HD void offer_keep(TaskRef* slot) {
    keep_ = slot;
  }
  // Gives back n tasks of the dynamic bound that this launch will not emit. Device: one thread.
  LOOM_HD void retire(std::uint32_t n) const {
    retire_slack(state_, n);
  }
  // One arrival on event e (besides the task's own completion). Device: one thread calls.
  LOOM_HD bool arrive(EventId e) const {
    Watchdog dog(*state_.error, who_, state_.watchdog_ns, WaitSite::queue_slot, state_.ready.id);
    return loom::arrive(state_, e, epoch_, who_, dog);
  }
  // A mark in the launch's trace when tracing is on (else nothing): an instant of kind `kind` (a
  // number of the pipeline's own, below kTraceMark) with two values, on this actor's track.
  // Device: one thread calls.
  LOOM_HD void trace_mark(std::uint16_t kind, std::uint32_t a, std::uint32_t b) const {
    record_mark(state_,
                who_.actor == Actor::subscriber ? kTraceBySubscriber | who_.block : who_.block,
                kind, a, b);
  }
  // The launch's watchdog bound, for actors that time their own waits (0: unbounded).
  LOOM_HD std::uint64_t watchdog_ns() const {
    return state_.watchdog_ns;
  }
  // Records that a wait of this actor on `site` / `object` outlived its bound (a decoder waiting
  // on a peer names the peer rank as `object` with WaitSite::signal).
  LOOM_HD void report_stalled_wait(WaitSite site, std::uint32_t object, std::uint64_t expected,
                                   std::uint64_t seen) const {
    raise_error(*state_.error, ErrorCode::watchdog, who_.actor, who_.block, who_.rank,
                static_cast<std::uint32_t>(site), object, expected, seen);
  }
  // A watchdog for a wait inside a task body (e.g. on a peer's signal).
  LOOM_HD Watchdog watchdog(WaitSite site, std::uint32_t object) const {
    return Watchdog(*state_.error, who_, state_.watchdog_ns, site, object);
  }
  // Records a failed check of the running task; the launch ends and the host raises it, naming
  // the task type (and, if the type has describe_failure, in its words). `code` is a source line
  // or a code of the type's own; a and b are values worth reporting.
  LOOM_HD void fail(std::uint32_t code, std::uint64_t a, std::uint64_t b) const {
    fail(task_type_, code, a, b);
  }
  // The same, naming the task type explicitly.
  LOOM_HD void fail(std::uint32_t task_type, std::uint32_t code, std::uint64_t a,
                    std::uint64_t b) const {
    raise_error(*state_.error, ErrorCode::task_assert, Actor::task, who_.block, who_.rank, code,
                task_type, a, b);
  }
  // Set by the processor before each body runs.
  LOOM_HD void set_task_type(std::uint32_t type) {
    task_type_ = type;
  }
  LOOM_HD std::uint32_t task_type() const {
    return task_type_;
  }
  LOOM_HD bool failed() const {
    return has_error(*state_.error);
  }
  // Records that a descriptor named a type outside the pipeline (`types` long).
  LOOM_HD void report_unknown_type(std::uint32_t type, std::uint32_t types) const {
    raise_error(*state_.error, ErrorCode::bad_task_type, who_.actor, who_.block, who_.rank, 0, type,
                types, type);
  }

 private:
  RuntimeState const& state_;
  std::uint64_t epoch_;
  WaiterId who_;
  SymmetricView const& heap_;
  void* shared_;
  TaskRef* keep_ = nullptr;
  std::uint32_t task_type_ = 0;
};

}  // namespace loom
