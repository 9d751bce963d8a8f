// Rendezvous for a multi-process job: rank 0 publishes an opaque blob (NCCL's 128-byte unique id)
// and ranks 1..world-1 receive it, through an address string:
//   file:/path/to/file   rank 0 writes the file atomically (temp file + rename); the others poll
//                        until it appears. The path must be fresh for each job.
//   tcp:HOST:PORT        rank 0 listens on HOST:PORT and serves the blob once to each other rank;
//                        the others connect, retrying until rank 0 listens. HOST is an IPv4 address
//                        or a name; only loopback addresses are accepted unless allow_remote is
//                        set.
// Every wait is bounded by a timeout; every failure throws loom::Error naming the address, the rank
// and what was missing. No CUDA or NCCL here: the host library and its tests use it without a GPU.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

using Blob = std::vector<std::uint8_t>;

// Largest blob a rank accepts; a longer length in a header means a corrupt or foreign peer.
inline constexpr std::uint64_t kMaxRendezvousBlobBytes = 1u << 20;

struct RendezvousOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  bool allow_remote = false;  // tcp: accept a host that is not a loopback address
};

// A parsed address. parse() checks the syntax only; whether a tcp host is loopback is decided when
// it is resolved (publish or fetch), since a name may resolve either way.
struct RendezvousAddress {
  enum class Scheme { file, tcp };
  Scheme scheme = Scheme::file;
  std::string text;        // as given; named in every error
  std::string path;        // file:
  std::string host;        // tcp:
  std::uint16_t port = 0;  // tcp: 1..65535

  static RendezvousAddress parse(std::string const& text);
};

// Rank 0: makes `blob` available to ranks 1..world-1. file: returns once the file is in place (it
// refuses a path that already exists: a file left by an earlier job would feed its blob to this
// one). tcp: returns once every other rank has fetched the blob; a rank that connects with another
// world size, an out-of-range rank or a rank already served is refused and the call throws.
void publish_blob(RendezvousAddress const& address, std::uint32_t world, Blob const& blob,
                  RendezvousOptions const& options = {});

// Ranks 1..world-1: waits for rank 0's blob and returns it; throws when rank 0 published for
// another world size.
Blob fetch_blob(RendezvousAddress const& address, std::uint32_t rank, std::uint32_t world,
                RendezvousOptions const& options = {});

// Every rank calls this: rank 0 publishes `blob_on_rank0` (ignored elsewhere) and every rank
// returns rank 0's blob. With world == 1 the address is not used.
Blob share_blob(std::string const& address, std::uint32_t rank, std::uint32_t world,
                Blob const& blob_on_rank0, RendezvousOptions const& options = {});

// One process's place in a job started by scripts/launch.sh.
struct RankEnvironment {
  std::uint32_t rank = 0;
  std::uint32_t world = 1;
  std::string rendezvous;  // address for share_blob; may be empty when world == 1
  int device = 0;          // CUDA device this rank drives

  // Reads LOOM_RANK and LOOM_WORLD (required; 0 <= rank < world <= kMaxRanks), LOOM_RENDEZVOUS
  // (required when world > 1; syntax checked) and LOOM_DEVICE (optional, default = rank).
  static RankEnvironment from_environment();
};

}  // namespace loom
