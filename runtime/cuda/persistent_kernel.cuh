// The persistent kernel: one launch, every block resident. Blocks 0 .. grid-2 are processors; the
// last block is the OS block, whose warp 0 is the scheduler and whose other warps are subscribers.
// All of them run the protocol of runtime/ (queues, doorbells, events, epochs) unchanged; this
// file only maps actors onto blocks, warps and shared memory.
#pragma once

#include "runtime/cuda/processor_finish.cuh"
#include "runtime/cuda/scheduler_warp.cuh"
#include "runtime/host_actors.hpp"

namespace loom {

// Shared memory of a processor block besides the task type's own. Thread 0's protocol state lives
// here, not in registers: a task body gets every register the launch bounds allow, none held for
// the runtime across it.
struct ProcessorShared {
  Task task;
  Task next;  // warp 1's: the descriptor of `peeked` (peek_ring_warp)
  TaskRef ref;
  TaskRef peeked;         // the ring warp 1 took during the last finish, or kStopRef
  TaskRef body_kept;      // a task the body emitted and kept to run next (TaskContext::offer_keep)
  ProcessorLink link;     // thread 0's
  std::uint64_t asked;    // thread 0, tracing: when it began waiting for the task
  std::uint64_t started;  // thread 0, tracing: when the task began
  bool alive;             // thread 0: false once an error ended this actor
};

// A block barrier that first reconverges each warp: thread 0's waits and a task body's
// lane-divergent paths must not leave a warp split when it reaches bar.sync.
__device__ __forceinline__ void block_barrier() {
  __syncwarp();
  __syncthreads();
}

// Warps 0 and 1 alone (named barrier 1; every body has ended, so none of its barriers is open).
__device__ __forceinline__ void first_two_warps_barrier() {
  __syncwarp();
  asm volatile("bar.sync 1, 64;" ::: "memory");
}

// Processor block: thread 0 takes the next task (take_next_task: doorbell, reports; then the
// prefetch credit), every thread copies the descriptor and runs the body, and warp 0 completes
// the task (finish_task_warp: the arrival on its event, the release of its successors) while
// warp 1 peeks at the doorbell for the ring a prefetch credit asked for and loads its descriptor
// (peek_ring_warp). Three block barriers per task, and one of warps 0 and 1. When thread 0's
// arrival releases a successor and the scheduler holds no backlog, the block runs that successor
// next without going through the scheduler (local dispatch), as it runs a task its body emitted
// and kept (then no successor is kept). Thread 0 builds its watchdogs where it waits, so that
// they hold no registers during a body. Inlined into the kernel: ptxas serializes a wgmma
// pipeline that sits in a called function.
template <class Pipeline, class Policy>
__device__ __forceinline__ void run_processor_block(RuntimeState const& s,
                                                    SymmetricView const& heap,
                                                    unsigned char* task_shared) {
  __shared__ ProcessorShared sh;
  std::uint32_t const me = blockIdx.x;
  WaiterId const who{Actor::processor, me, s.rank};
  std::uint64_t const epoch = load_acquire(s.counters->epoch.value);
  TaskContext ctx(s, epoch, who, heap, task_shared);
  ctx.offer_keep(&sh.body_kept);
  if (threadIdx.x == 0) {
    sh.link = ProcessorLink::start(me);
    take_start_root(s, sh.link, start_root<Policy>(s, me));
    sh.peeked = kStopRef;
    sh.alive = true;
  }
  for (;;) {
    if (threadIdx.x == 0) {
      // Reset here, not in the finish: warp 0's lanes read the last body's keep there, and the
      // barrier of warps 0 and 1 orders those reads before this store.
      sh.body_kept = kStopRef;
      TaskRef ref = kStopRef;
      if (s.trace) sh.asked = now_ns();
      if (sh.alive) {
        Watchdog bell_dog(*s.error, who, 2 * s.watchdog_ns, WaitSite::doorbell, me);
        sh.alive = take_next_task(s, sh.link, s.doorbells[me], bell_dog, ref, sh.peeked);
      }
      sh.ref = sh.alive ? ref : kStopRef;
    }
    block_barrier();
    TaskRef const ref = sh.ref;
    if (ref == kStopRef) return;
    // Dynamic descriptors were written by other SMs in this launch: read them from L2, unless
    // warp 1 already did (the peeked ring). Warp 1 loads while thread 0 gives the prefetch credit
    // (one store).
    static_assert(sizeof(Task) / sizeof(uint4) <= 32);
    if (threadIdx.x >= 32 && threadIdx.x < 32 + sizeof(Task) / sizeof(uint4)) {
      unsigned const i = threadIdx.x - 32;
      uint4 const* src = reinterpret_cast<uint4 const*>(&s.task(ref));
      reinterpret_cast<uint4*>(&sh.task)[i] =
          ref == sh.peeked ? reinterpret_cast<uint4 const*>(&sh.next)[i] : __ldcg(src + i);
    }
    if (threadIdx.x == 0) {
      // A compiler barrier: without it the compiler loaded sh.link.credit_due in every thread
      // ahead of this test (a shared load may be speculated) while thread 0 writes it below, a
      // read racecheck reports though no other thread uses the value.
      asm volatile("" ::: "memory");
      give_prefetch_credit(s, sh.link);
    }
    block_barrier();
    if (s.trace && threadIdx.x == 0) sh.started = now_ns();
    ctx.set_task_type(sh.task.header.type);
    Pipeline::run_device(sh.task, ctx);  // an unknown type is recorded as an error
    block_barrier();
    if (threadIdx.x < 32) {
      if (threadIdx.x == 0) record_trace(s, sh.task, me, sh.asked, sh.started);
      TaskRef const kept = sh.body_kept;
      bool const ok = finish_task_warp(s, sh.link, sh.task, epoch, who,
                                       Policy::local_dispatch && kept == kStopRef);
      if (threadIdx.x == 0) {
        sh.alive = ok;
        if (ok && kept != kStopRef) sh.link.kept = kept;
      }
    } else if (threadIdx.x < 64) {
      peek_ring_warp(s, sh.link, s.doorbells[me], sh.next, sh.peeked);
    }
    if (threadIdx.x < 64) first_two_warps_barrier();  // the peek before thread 0's take
  }
}

// The block's dynamic shared memory, in bytes.
__device__ __forceinline__ std::uint32_t dynamic_shared_bytes() {
  std::uint32_t bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  return bytes;
}

// OS block: warp 0 schedules, keeping its private words in the block's dynamic shared memory
// when they fit (SchedulerPrivate); lane 0 of each of the next `subscribers` warps subscribes;
// the rest of the block leaves at once.
template <class Policy, class Decoder>
__device__ void run_os_block(RuntimeState const& s, SymmetricView const& heap, Decoder decoder,
                             void* shared) {
  std::uint32_t const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0) {
    run_scheduler_warp<Policy>(s, WaiterId{Actor::scheduler, blockIdx.x, s.rank},
                               SchedulerPrivate::in(s, shared, dynamic_shared_bytes()));
  } else if (lane == 0 && warp - 1 < s.subscribers) {
    run_subscriber(s, warp - 1, decoder, heap);
  }
}

// The parameters are grid constants: the actors hold references to them (TaskContext, the task
// bodies that run as calls), and a reference to a plain kernel parameter would make every thread
// copy it to local memory and read it from there.
//
// Internal linkage: each .cu file that launches a pipeline has its own kernel. With one external
// symbol, two files that run the same pipeline register two kernels under one host stub, and the
// runtime set the shared-memory attribute on one and launched the other
// (cudaErrorCooperativeLaunchTooLarge on every launch from one of the files). GpuExecutor reads
// the kernel's address from one object, so all its launches use the same file's kernel.
template <class Pipeline, class Policy, class Decoder>
static __global__ void __launch_bounds__(Pipeline::threads, 1)
    persistent_kernel(__grid_constant__ RuntimeState const s,
                      __grid_constant__ SymmetricView const heap,
                      __grid_constant__ Decoder const decoder) {
  extern __shared__ uint4 task_shared[];
  if (blockIdx.x == gridDim.x - 1) {
    run_os_block<Policy>(s, heap, decoder, task_shared);
  } else {
    run_processor_block<Pipeline, Policy>(s, heap, reinterpret_cast<unsigned char*>(task_shared));
  }
}

}  // namespace loom
