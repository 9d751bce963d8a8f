// A pipeline is a compile-time list of task types. A task type is one struct:
//
//   struct RowSoftmax {
//     static constexpr char const* name = "row_softmax";
//     static constexpr unsigned threads = 128;        // block size its device body needs
//     static constexpr unsigned shared_bytes = 0;     // dynamic shared memory it needs
//     struct Payload { ... };                         // trivially copyable, <= 48 bytes
//     static void host(Payload const&, loom::TaskContext&);               // CPU executor
//     __device__ static void device(Payload const&, loom::TaskContext&);  // inside #ifdef
//     __CUDACC__
//     static constexpr bool call_body = false;        // optional; see below
//   };
//   using MyPipeline = loom::Pipeline<RowSoftmax, ...>;
//
// The type id is the position in the list, dispatch is generated from the list, and adding a
// type touches nothing in runtime/.
//
// On the device a body is inlined into the kernel's switch over types by default. That is what
// a wgmma pipeline needs (ptxas serializes wgmma across a call) and what short bodies prefer (the
// one-GPU MoE layer ran 0.3-1.7% slower on an H100 with its route, plan and gather as calls). A
// type whose body keeps many values live at once says `static constexpr bool call_body = true`
// and runs as a call: inlined, its registers compete with everything live around the switch and
// with every other inlined body, and ptxas spills what does not fit (the MoE combine kept its
// fp32 sums in local memory that way); as a call it gets the registers to itself.
#pragma once

#include <algorithm>
#include <string>
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

// Whether a task type's device body runs as a call (T::call_body) instead of inlined.
template <class T, class = void>
struct call_body : std::false_type {};
template <class T>
struct call_body<T, std::void_t<decltype(T::call_body)>> : std::bool_constant<T::call_body> {};

// A task type may explain its own failed checks: static std::string describe_failure(code, a, b).
template <class T, class = void>
struct has_describe_failure : std::false_type {};
template <class T>
struct has_describe_failure<
    T, std::void_t<decltype(T::describe_failure(0u, std::uint64_t{}, std::uint64_t{}))>>
    : std::true_type {};
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

  // Whether T's device body runs as a call (T::call_body) rather than inlined into the kernel.
  template <class T>
  static constexpr bool called = (id<T>, detail::call_body<T>::value);

  // Encodes a task of type T that completes `completes` (kNoEvent: none).
  template <class T>
  static Task make(typename T::Payload const& payload, EventId completes = kNoEvent,
                   std::uint32_t id_ = 0, std::uint8_t priority = 0) {
    return encode_task(id<T>, payload, completes, id_, priority);
  }
  template <class T>
  LOOM_HD static Task make_dynamic(typename T::Payload const& payload, EventId completes = kNoEvent,
                                   std::uint32_t id_ = 0, std::uint8_t priority = 0) {
    return encode_task(id<T>, payload, completes, id_, priority);
  }

  // The message for a launch's error record, in the words of the failing task type when it has
  // describe_failure.
  static std::string describe(ErrorRecord const& e) {
    if (static_cast<ErrorCode>(e.code) == ErrorCode::task_assert && e.object < size) {
      std::string custom;
      std::uint32_t i = 0;
      ((i++ == e.object ? (custom = failure_text<Types>(e), 0) : 0), ...);
      if (!custom.empty())
        return std::string("loom: ") + names[e.object] + " failed (block " +
               std::to_string(e.block) + ", rank " + std::to_string(e.rank) + "): " + custom;
    }
    return loom::describe(e, names, size);
  }

  // Runs the host body of the task's type. For a type not in the list: records bad_task_type in the
  // launch's error record and returns false.
  static bool run_host(Task const& task, TaskContext& ctx) {
    return run_host_impl(task, ctx, std::index_sequence_for<Types...>{});
  }

#if defined(__CUDACC__)
  // Runs the device body; called by every thread of the processor block. The switch is inlined
  // into the persistent kernel; so is each body, unless its type asks to be called.
  __device__ __forceinline__ static bool run_device(Task const& task, TaskContext& ctx) {
    return run_device_impl(task, ctx, std::index_sequence_for<Types...>{});
  }
#endif

 private:
  template <class T>
  static std::string failure_text(ErrorRecord const& e) {
    if constexpr (detail::has_describe_failure<T>::value)
      return T::describe_failure(e.site, e.expected, e.seen);
    else
      return std::string();
  }

  template <std::size_t... I>
  static bool run_host_impl(Task const& task, TaskContext& ctx, std::index_sequence<I...>) {
    bool const known =
        ((task.header.type == I ? (Types::host(task.as<typename Types::Payload>(), ctx), true)
                                : false) ||
         ...);
    if (!known) ctx.report_unknown_type(task.header.type, size);
    return known;
  }
#if defined(__CUDACC__)
  // The context goes by value: a reference would keep the kernel's own context in local memory,
  // and the inlined bodies would read its words from there.
  template <class T>
  __device__ __noinline__ static void call_device(typename T::Payload const& p, TaskContext ctx) {
    T::device(p, ctx);
  }
  template <class T>
  __device__ __forceinline__ static void run_body(Task const& task, TaskContext& ctx) {
    if constexpr (detail::call_body<T>::value)
      call_device<T>(task.as<typename T::Payload>(), ctx);
    else
      T::device(task.as<typename T::Payload>(), ctx);
  }
  template <std::size_t... I>
  __device__ __forceinline__ static bool run_device_impl(Task const& task, TaskContext& ctx,
                                                         std::index_sequence<I...>) {
    bool const known =
        ((task.header.type == I ? (run_body<Types>(task, ctx), true) : false) || ...);
    if (!known) ctx.report_unknown_type(task.header.type, size);
    return known;
  }
#endif
};

}  // namespace loom
