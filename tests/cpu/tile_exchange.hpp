// A small exchange between virtual ranks over the host symmetric heap: SendTile puts a tile of
// floats into a peer's receive region and raises the tile's flag to the launch's epoch; the
// peer's TileDecoder (run by its subscribers) turns each arrived tile into one dynamic ConsumeTile
// that scales it into an output buffer. Flags are epoch-valued, so nothing is reset between
// launches.
#pragma once

#include <vector>

#include "tests/cpu/test_support.hpp"

namespace loom::test {

struct SendTile {
  static constexpr char const* name = "send_tile";
  static constexpr unsigned threads = 128;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    float const* src;           // host memory of the sending rank
    std::uint64_t recv_offset;  // of the destination slot in the symmetric heap
    std::uint64_t flag_offset;  // of the slot's flag in the symmetric heap
    std::uint32_t dst_rank;
    std::uint32_t floats;
  };
  static void host(Payload const& p, TaskContext& ctx) {
    SymmetricView const& heap = ctx.heap();
    heap.put_serial(p.dst_rank, heap.local<float>(p.recv_offset), p.src,
                    std::uint64_t{p.floats} * sizeof(float));
    heap.signal_set(p.dst_rank, heap.local<std::uint64_t>(p.flag_offset), ctx.epoch());
  }
};

struct ConsumeTile {
  static constexpr char const* name = "consume_tile";
  static constexpr unsigned threads = 64;
  static constexpr unsigned shared_bytes = 0;
  struct Payload {
    float const* src;  // this rank's receive slot
    float* dst;
    Recorder* recorder;
    float scale;
    std::uint32_t floats;
    std::uint32_t slot;  // recorder slot
  };
  static void host(Payload const& p, TaskContext& ctx) {
    for (std::uint32_t i = 0; i < p.floats; ++i) p.dst[i] = p.src[i] * p.scale;
    p.recorder->stamp(p.slot, ctx);
  }
};

using ExchangePipeline = Pipeline<SendTile, ConsumeTile, Stamp, CheckedFail>;

// One per rank. Subscriber `index` of `count` owns the slots s with s % count == index; decoded[s]
// remembers the launch in which slot s was last decoded, so each arrival is decoded once.
struct TileDecoder {
  std::uint64_t const* flags = nullptr;  // this rank's flags in the symmetric heap
  float const* recv = nullptr;           // this rank's receive region
  std::uint64_t* decoded = nullptr;      // [slots], host memory owned by the test
  float* out = nullptr;                  // [slots * floats]
  Recorder* recorder = nullptr;          // slot s stamps recorder slot first_record + s
  std::uint32_t first_record = 0;
  std::uint32_t slots = 0;
  std::uint32_t floats = 0;
  float scale = 1.0f;
  EventId consumed = kNoEvent;  // every ConsumeTile completes it

  bool poll(TaskContext& ctx, std::uint32_t index, std::uint32_t count) {
    bool progress = false;
    for (std::uint32_t s = index; s < slots; s += count) {
      if (decoded[s] >= ctx.epoch()) continue;
      if (!SymmetricView::arrived(&flags[s], ctx.epoch())) continue;
      decoded[s] = ctx.epoch();
      progress = true;
      Task const t = ExchangePipeline::make_dynamic<ConsumeTile>(
          ConsumeTile::Payload{recv + std::size_t{s} * floats, out + std::size_t{s} * floats,
                               recorder, scale, floats, first_record + s},
          consumed, s);
      if (!ctx.emit(t)) return progress;
    }
    return progress;
  }
};

}  // namespace loom::test
