// A pipeline is a compile-time list of task types. A task type is one struct:
//
//   struct RowSoftmax {
//     static constexpr char const* name = "row_softmax";
//     static constexpr unsigned threads = 128;        // block size its device body needs
//     static constexpr unsigned shared_bytes = 0;     // dynamic shared memory it needs
//     struct Payload { ... };                         // trivially copyable, <= 48 bytes
//     static void host(Payload const&, loom::TaskContext&);               // CPU executor
//     __device__ static void device(Payload const&, loom::TaskContext&);  // inside #ifdef __CUDACC__
//   };
//   using MyPipeline = loom::Pipeline<RowSoftmax, ...>;
//
// The type id is the position in the list, dispatch is generated from the list, and adding a
// type touches nothing in runtime/.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>

#include "runtime/context.hpp"

namespace loom {

namespace detail {
template <class T, class... Ts>
struct index_of;
template <class T, class... Ts>
struct index_of<T, T, Ts...> : std::integral_constant<std::uint16_t, 0> {};
template <class T, class U, class... Ts>
struct index_of<T, U, Ts...>
    : std::integral_constant<std::uint16_t, 1 + index_of<T, Ts...>::value> {};
template <class T>
struct index_of<T> {
  static_assert(sizeof(T) == 0, "task type is not in this pipeline");
};
}  // namespace detail

template <class... Types>
struct Pipeline {
  static_assert(sizeof...(Types) > 0, "a pipeline needs at least one task type");
  static_assert(sizeof...(Types) < 0xFFFF, "too many task types");

  static constexpr std::uint32_t size = sizeof...(Types);
  static constexpr unsigned threads = std::max({Types::threads...});
  static constexpr unsigned shared_bytes = std::max({Types::shared_bytes...});
  static_assert(threads % 32 == 0 && threads >= 64,
                "block size must be whole warps and leave the OS block a scheduler and a "
                "subscriber warp");

  template <class T>
  static constexpr std::uint16_t id = detail::index_of<T, Types...>::value;

  static constexpr char const* names[] = {Types::name...};

  // Encodes a task of type T that completes `completes` (kNoEvent: none).
  template <class T>
  static Task make(typename T::Payload const& payload, EventId completes = kNoEvent,
                   std::uint32_t id_ = 0, std::uint8_t priority = 0) {
    return encode_task(id<T>, payload, completes, id_, priority);
  }
  template <class T>
  LOOM_HD static Task make_dynamic(typename T::Payload const& payload,
                                   EventId completes = kNoEvent, std::uint32_t id_ = 0,
                                   std::uint8_t priority = 0) {
    return encode_task(id<T>, payload, completes, id_, priority);
  }

  // Runs the host body of the task's type. For a type not in the list: records bad_task_type in the
  // launch's error record and returns false.
  static bool run_host(Task const& task, TaskContext& ctx) {
    return run_host_impl(task, ctx, std::index_sequence_for<Types...>{});
  }

#if defined(__CUDACC__)
  // Runs the device body; called by every thread of the processor block.
  __device__ static bool run_device(Task const& task, TaskContext& ctx) {
    return run_device_impl(task, ctx, std::index_sequence_for<Types...>{});
  }
#endif

 private:
  template <std::size_t... I>
  static bool run_host_impl(Task const& task, TaskContext& ctx, std::index_sequence<I...>) {
    bool const known = ((task.header.type == I
                             ? (Types::host(task.as<typename Types::Payload>(), ctx), true)
                             : false) ||
                        ...);
    if (!known) ctx.report_unknown_type(task.header.type, size);
    return known;
  }
#if defined(__CUDACC__)
  template <std::size_t... I>
  __device__ static bool run_device_impl(Task const& task, TaskContext& ctx,
                                         std::index_sequence<I...>) {
    bool const known = ((task.header.type == I
                             ? (Types::device(task.as<typename Types::Payload>(), ctx), true)
                             : false) ||
                        ...);
    if (!known) ctx.report_unknown_type(task.header.type, size);
    return known;
  }
#endif
};

}  // namespace loom
