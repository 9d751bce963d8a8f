// Internals of the rendezvous (runtime/bootstrap.hpp), shared by its file: and tcp: transports:
// the wire format, the party named in every error, deadlines, descriptor ownership and whole-buffer
// I/O. Host only; not part of the public API.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "runtime/bootstrap.hpp"
#include "runtime/error.hpp"

namespace loom::rendezvous_detail {

// ---- wire format: the same header starts the file and rank 0's reply ------------------------
// hello  (rank r -> rank 0): magic[8] | rank u32 | world u32                      (16 bytes)
// header (file, or reply)  : magic[8] | world u32 | status u32 | length u64      (24 bytes)
// then `length` blob bytes. Integers little-endian.
inline constexpr std::array<unsigned char, 8> kMagic = {'L', 'O', 'O', 'M', 'R', 'D', 'V', '1'};
inline constexpr std::size_t kHelloBytes = 16;
inline constexpr std::size_t kHeaderBytes = 24;

// Why rank 0 refused a connecting rank (sent in the reply header, length 0).
enum class Status : std::uint32_t { ok = 0, wrong_world, rank_out_of_range, rank_already_served };

struct Hello {
  std::uint32_t rank;
  std::uint32_t world;
};
struct Header {
  std::uint32_t world;
  Status status;
  std::uint64_t length;
};

inline void put_le(unsigned char* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint64_t get_le(unsigned char const* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

inline std::array<unsigned char, kHelloBytes> encode_hello(Hello h) {
  std::array<unsigned char, kHelloBytes> out{};
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  put_le(out.data() + 8, h.rank, 4);
  put_le(out.data() + 12, h.world, 4);
  return out;
}
// False when the bytes do not start with the magic.
inline bool decode_hello(unsigned char const* in, Hello& h) {
  if (!std::equal(kMagic.begin(), kMagic.end(), in)) return false;
  h.rank = static_cast<std::uint32_t>(get_le(in + 8, 4));
  h.world = static_cast<std::uint32_t>(get_le(in + 12, 4));
  return true;
}
inline std::array<unsigned char, kHeaderBytes> encode_header(Header h) {
  std::array<unsigned char, kHeaderBytes> out{};
  std::copy(kMagic.begin(), kMagic.end(), out.begin());
  put_le(out.data() + 8, h.world, 4);
  put_le(out.data() + 12, static_cast<std::uint32_t>(h.status), 4);
  put_le(out.data() + 16, h.length, 8);
  return out;
}
inline bool decode_header(unsigned char const* in, Header& h) {
  if (!std::equal(kMagic.begin(), kMagic.end(), in)) return false;
  h.world = static_cast<std::uint32_t>(get_le(in + 8, 4));
  h.status = static_cast<Status>(get_le(in + 12, 4));
  h.length = get_le(in + 16, 8);
  return true;
}

// ---- the party to a rendezvous, named in every error it raises -------------------------------
struct Party {
  RendezvousAddress const& address;
  std::uint32_t rank;
  std::uint32_t world;
  RendezvousOptions const& options;

  [[noreturn]] void fail(std::string const& what) const {
    throw Error("loom: rendezvous '" + address.text + "' (rank " + std::to_string(rank) + " of " +
                std::to_string(world) + "): " + what);
  }
  std::string timeout_text() const { return std::to_string(options.timeout.count()) + " ms"; }
};

inline std::string errno_text(int e) {
  return std::strerror(e);
}

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds timeout) : end_(Clock::now() + timeout) {}
  bool passed() const { return Clock::now() >= end_; }
  std::chrono::milliseconds remaining() const {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()));
  }

 private:
  Clock::time_point end_;
};

// Owns a file descriptor (file or socket); closes it on destruction.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(Fd const&) = delete;
  Fd& operator=(Fd const&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_;
};

// Writes all `n` bytes (a socket without SIGPIPE); false with errno set on failure.
bool write_all(int fd, void const* data, std::size_t n, bool socket);

// Reads until `n` bytes, end of stream (errno 0) or an error (errno set); returns the bytes read.
std::size_t read_up_to(int fd, void* data, std::size_t n, bool socket);

// Checks a header (the file's or rank 0's reply) against `p`; returns the blob length.
// `source` names where the header came from.
std::uint64_t check_header(Party const& p, unsigned char const* bytes, std::string const& source);

void publish_file(Party const& p, Blob const& blob);
Blob fetch_file(Party const& p);
void publish_tcp(Party const& p, Blob const& blob);
Blob fetch_tcp(Party const& p);

}  // namespace loom::rendezvous_detail
