// The rendezvous that carries NCCL's unique id from rank 0 to the other ranks of a multi-process
// job (runtime/bootstrap.hpp): real fork()ed processes over file: and tcp: addresses, timeouts,
// refused addresses and peers, and the rank environment that scripts/launch.sh sets.
#include "runtime/bootstrap.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "tests/cpu/test_support.hpp"

namespace loom::test {
namespace {

using std::chrono::milliseconds;

// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "loom-bootstrap.XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(std::string const& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A loopback port nobody listens on right now (the kernel's choice of a free ephemeral port).
std::uint16_t free_loopback_port() {
  int const fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("cannot find a free loopback port");
  ::close(fd);
  return ntohs(addr.sin_port);
}

Blob random_blob(std::uint32_t seed, std::size_t bytes) {
  std::mt19937 rng(seed);
  Blob b(bytes);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// A forked rank: runs `fetch` in a child process, which reports the blob it got ('B' + bytes) or
// the loom::Error it threw ('E' + message) through a pipe.
struct Child {
  pid_t pid = -1;
  int pipe_fd = -1;
};

template <class Fetch>
Child fork_rank(Fetch fetch) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  pid_t const pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    try {
      Blob const b = fetch();
      out = "B" + std::string(b.begin(), b.end());
    } catch (std::exception const& e) {
      out = std::string("E") + e.what();
    }
    std::size_t done = 0;
    while (done < out.size()) {
      ssize_t const w = ::write(fds[1], out.data() + done, out.size() - done);
      if (w <= 0) ::_exit(3);
      done += static_cast<std::size_t>(w);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Waits for the child; returns what it reported ("B..." or "E..."), or a note if it died.
std::string collect(Child const& c) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t const r = ::read(c.pipe_fd, buf, sizeof buf);
    if (r <= 0) break;
    out.append(buf, static_cast<std::size_t>(r));
  }
  ::close(c.pipe_fd);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "child exited abnormally (status " + std::to_string(status) + "): " + out;
  return out;
}

std::string as_reported(Blob const& b) {
  return "B" + std::string(b.begin(), b.end());
}

RendezvousOptions within(milliseconds timeout) {
  RendezvousOptions o;
  o.timeout = timeout;
  return o;
}

enum class Scheme { file, tcp };

std::string fresh_address(Scheme s, TempDir const& dir) {
  return s == Scheme::file ? "file:" + dir.file("rendezvous")
                           : "tcp:127.0.0.1:" + std::to_string(free_loopback_port());
}

// ---- every rank receives rank 0's blob --------------------------------------------------------

class RendezvousAcrossProcesses
    : public ::testing::TestWithParam<std::tuple<Scheme, std::uint32_t>> {};

TEST_P(RendezvousAcrossProcesses, EveryRankReceivesRankZerosBlobByteForByte) {
  auto const [scheme, world] = GetParam();
  TracedSeed const seed;
  TempDir const dir;
  std::string const address = fresh_address(scheme, dir);
  Blob const blob = random_blob(seed, 128);  // the size of an ncclUniqueId

  std::vector<Child> children;
  for (std::uint32_t r = 1; r < world; ++r)
    children.push_back(fork_rank(
        [&, r] { return share_blob(address, r, world, {}, within(milliseconds(20000))); }));
  Blob got_on_rank0;
  std::string const published = error_of(
      [&] { got_on_rank0 = share_blob(address, 0, world, blob, within(milliseconds(20000))); });
  if (published != "<no loom::Error thrown>")
    for (auto const& c : children) ::kill(c.pid, SIGKILL);
  EXPECT_EQ(published, "<no loom::Error thrown>");
  EXPECT_EQ(got_on_rank0, blob);
  for (std::uint32_t r = 1; r < world; ++r)
    EXPECT_EQ(collect(children[r - 1]), as_reported(blob)) << "rank " << r << " via " << address;
}

INSTANTIATE_TEST_SUITE_P(Bootstrap, RendezvousAcrossProcesses,
                         ::testing::Combine(::testing::Values(Scheme::file, Scheme::tcp),
                                            ::testing::Values(2u, 4u, 8u)),
                         [](auto const& info) {
                           return std::string(std::get<0>(info.param) == Scheme::file ? "file"
                                                                                      : "tcp") +
                                  "_world" + std::to_string(std::get<1>(info.param));
                         });

// ---- timeouts --------------------------------------------------------------------------------

TEST(BootstrapTimeout, MissingRankZeroEndsInATimeoutNamingTheAddressAndRank) {
  TempDir const dir;
  for (Scheme s : {Scheme::file, Scheme::tcp}) {
    std::string const address = fresh_address(s, dir);
    auto const started = std::chrono::steady_clock::now();
    std::string const message = error_of(
        [&] { fetch_blob(RendezvousAddress::parse(address), 1, 2, within(milliseconds(200))); });
    EXPECT_TRUE(mentions(message, "'" + address + "'"));
    EXPECT_TRUE(mentions(message, "rank 1 of 2"));
    EXPECT_TRUE(mentions(message, "timed out after 200 ms"));
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5)) << address;
  }
}

TEST(BootstrapTimeout, PublisherNamesTheRanksThatNeverFetched) {
  TempDir const dir;
  std::string const address = fresh_address(Scheme::tcp, dir);
  std::string const message = error_of([&] {
    publish_blob(RendezvousAddress::parse(address), 3, Blob(8, 1), within(milliseconds(200)));
  });
  EXPECT_TRUE(mentions(message, "'" + address + "' (rank 0 of 3)"));
  EXPECT_TRUE(mentions(message, "rank(s) 1, 2 never fetched"));
}

// ---- refused addresses and peers -------------------------------------------------------------

TEST(BootstrapAddress, NonLoopbackTcpHostIsRefused) {
  for (std::string const address : {"tcp:10.1.2.3:5000", "tcp:192.0.2.7:5000"}) {
    auto const a = RendezvousAddress::parse(address);
    std::string const published =
        error_of([&] { publish_blob(a, 2, Blob(4, 0), within(milliseconds(200))); });
    std::string const fetched = error_of([&] { fetch_blob(a, 1, 2, within(milliseconds(200))); });
    for (std::string const& m : {published, fetched}) {
      EXPECT_TRUE(mentions(m, "'" + address + "'"));
      EXPECT_TRUE(mentions(m, "is not a loopback address"));
      EXPECT_TRUE(mentions(m, "allow_remote"));
    }
  }
}

TEST(BootstrapAddress, MalformedAddressesAreRefusedWithTheExpectedForm) {
  std::map<std::string, std::string> const reasons = {
      {"", "has no file: or tcp: scheme"},
      {"/tmp/rendezvous", "has no file: or tcp: scheme"},
      {"udp:127.0.0.1:5000", "has no file: or tcp: scheme"},
      {"file:", "names no file"},
      {"tcp:127.0.0.1", "has no port"},
      {"tcp::5000", "has no host"},
      {"tcp:127.0.0.1:", "has port '', not a number in 1..65535"},
      {"tcp:127.0.0.1:0", "has port '0'"},
      {"tcp:127.0.0.1:65536", "has port '65536'"},
      {"tcp:127.0.0.1:12ab", "has port '12ab'"},
      {"tcp:::1:5000", "IPv6"},
  };
  for (auto const& [address, reason] : reasons) {
    std::string const message = error_of([&] { RendezvousAddress::parse(address); });
    EXPECT_TRUE(mentions(message, "rendezvous address '" + address + "'"));
    EXPECT_TRUE(mentions(message, reason));
    EXPECT_TRUE(mentions(message, "expected file:/path/to/file or tcp:HOST:PORT"));
  }
  auto const tcp = RendezvousAddress::parse("tcp:127.0.0.1:29500");
  EXPECT_EQ(tcp.host, "127.0.0.1");
  EXPECT_EQ(tcp.port, 29500);
  EXPECT_EQ(RendezvousAddress::parse("file:relative/path").path, "relative/path");
}

TEST(BootstrapPeers, RankStartedWithAnotherWorldSizeIsRefusedOnBothSides) {
  TempDir const dir;
  // file: rank 0 wrote for world 2; a rank that believes in world 3 refuses the file.
  std::string const file = fresh_address(Scheme::file, dir);
  publish_blob(RendezvousAddress::parse(file), 2, Blob(16, 7));
  std::string const from_file = error_of([&] { fetch_blob(RendezvousAddress::parse(file), 1, 3); });
  EXPECT_TRUE(mentions(from_file, "published for world 2"));
  EXPECT_TRUE(mentions(from_file, "started with world 3"));

  // tcp: rank 0 tells the connecting rank why it is refused, and fails itself.
  std::string const tcp = fresh_address(Scheme::tcp, dir);
  Child const child = fork_rank(
      [&] { return fetch_blob(RendezvousAddress::parse(tcp), 1, 3, within(milliseconds(10000))); });
  std::string const served = error_of([&] {
    publish_blob(RendezvousAddress::parse(tcp), 2, Blob(16, 7), within(milliseconds(10000)));
  });
  EXPECT_TRUE(mentions(served, "rank 1 connected with world 3, but this job has world 2"));
  std::string const refused = collect(child);
  EXPECT_TRUE(mentions(refused, "Eloom: rendezvous '" + tcp + "' (rank 1 of 3)"));
  EXPECT_TRUE(mentions(refused, "rank 0 serves world 2"));
}

TEST(BootstrapPeers, TwoProcessesStartedAsOneRankAreRefused) {
  TempDir const dir;
  std::string const tcp = fresh_address(Scheme::tcp, dir);
  auto fetch_as_rank1 = [&] {
    return fetch_blob(RendezvousAddress::parse(tcp), 1, 3, within(milliseconds(10000)));
  };
  Child const first = fork_rank(fetch_as_rank1);
  Child const second = fork_rank(fetch_as_rank1);
  std::string const served = error_of([&] {
    publish_blob(RendezvousAddress::parse(tcp), 3, Blob(16, 9), within(milliseconds(10000)));
  });
  EXPECT_TRUE(mentions(served, "rank 1 connected twice"));
  std::string const a = collect(first), b = collect(second);
  // One of them got the blob, the other was told it is a duplicate.
  EXPECT_TRUE((a == as_reported(Blob(16, 9))) != (b == as_reported(Blob(16, 9))))
      << a << " / " << b;
  EXPECT_TRUE(mentions(a + b, "two processes were started as the same rank"));
}

TEST(BootstrapPeers, PublisherRefusesAFileLeftByAnEarlierJob) {
  TempDir const dir;
  std::string const file = fresh_address(Scheme::file, dir);
  publish_blob(RendezvousAddress::parse(file), 2, Blob(4, 1));
  std::string const message =
      error_of([&] { publish_blob(RendezvousAddress::parse(file), 2, Blob(4, 2)); });
  EXPECT_TRUE(mentions(message, "already exists"));
}

TEST(BootstrapPeers, TruncatedFileIsAShortRead) {
  TempDir const dir;
  std::string const path = dir.file("rendezvous");
  std::ofstream(path) << "LOOM";
  std::string const message =
      error_of([&] { fetch_blob(RendezvousAddress::parse("file:" + path), 1, 2); });
  EXPECT_TRUE(mentions(message, path + " is truncated: it holds 4 bytes"));
}

TEST(BootstrapPeers, RankZeroClosingTheConnectionEarlyIsAShortRead) {
  TempDir const dir;
  std::uint16_t const port = free_loopback_port();
  int const listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  int const one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  std::thread impostor([&] {  // accepts, then hangs up without a reply
    int const conn = ::accept(listener, nullptr, nullptr);
    if (conn >= 0) ::close(conn);
  });
  std::string const address = "tcp:127.0.0.1:" + std::to_string(port);
  std::string const message = error_of(
      [&] { fetch_blob(RendezvousAddress::parse(address), 1, 2, within(milliseconds(5000))); });
  impostor.join();
  ::close(listener);
  EXPECT_TRUE(mentions(message, "short read: rank 0 sent 0 of the 24 header bytes"));
}

// ---- the rank environment --------------------------------------------------------------------

// Sets (or, with nullopt, unsets) the LOOM_* variables for one test and restores them afterwards.
class ScopedLoomEnvironment {
 public:
  using Values = std::map<std::string, std::optional<std::string>>;
  explicit ScopedLoomEnvironment(Values const& values) {
    for (char const* name : {"LOOM_RANK", "LOOM_WORLD", "LOOM_RENDEZVOUS", "LOOM_DEVICE"}) {
      char const* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      auto const it = values.find(name);
      set(name, it == values.end() ? std::nullopt : it->second);
    }
  }
  ~ScopedLoomEnvironment() {
    for (auto const& [name, value] : saved_) set(name.c_str(), value);
  }

 private:
  static void set(char const* name, std::optional<std::string> const& value) {
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(BootstrapEnvironment, ReadsRankWorldAddressAndDevice) {
  ScopedLoomEnvironment const env({{"LOOM_RANK", "2"},
                                   {"LOOM_WORLD", "4"},
                                   {"LOOM_RENDEZVOUS", "tcp:127.0.0.1:29500"},
                                   {"LOOM_DEVICE", "5"}});
  RankEnvironment const e = RankEnvironment::from_environment();
  EXPECT_EQ(e.rank, 2u);
  EXPECT_EQ(e.world, 4u);
  EXPECT_EQ(e.rendezvous, "tcp:127.0.0.1:29500");
  EXPECT_EQ(e.device, 5);
}

TEST(BootstrapEnvironment, DeviceDefaultsToTheRankAndOneRankNeedsNoAddress) {
  {
    ScopedLoomEnvironment const env(
        {{"LOOM_RANK", "1"}, {"LOOM_WORLD", "2"}, {"LOOM_RENDEZVOUS", "file:/tmp/x"}});
    EXPECT_EQ(RankEnvironment::from_environment().device, 1);
  }
  ScopedLoomEnvironment const env({{"LOOM_RANK", "0"}, {"LOOM_WORLD", "1"}});
  RankEnvironment const e = RankEnvironment::from_environment();
  EXPECT_EQ(e.world, 1u);
  EXPECT_EQ(e.rendezvous, "");
  EXPECT_EQ(share_blob(e.rendezvous, 0, 1, Blob(3, 4)), Blob(3, 4));
}

TEST(BootstrapEnvironment, ErrorsNameTheVariableAndWhatIsWrong) {
  using V = ScopedLoomEnvironment::Values;
  std::vector<std::pair<V, std::string>> const cases = {
      {{{"LOOM_WORLD", "2"}, {"LOOM_RENDEZVOUS", "file:/tmp/x"}}, "LOOM_RANK is not set"},
      {{{"LOOM_RANK", "0"}, {"LOOM_RENDEZVOUS", "file:/tmp/x"}}, "LOOM_WORLD is not set"},
      {{{"LOOM_RANK", "x"}, {"LOOM_WORLD", "2"}}, "LOOM_RANK='x' is not a non-negative integer"},
      {{{"LOOM_RANK", "-1"}, {"LOOM_WORLD", "2"}}, "LOOM_RANK='-1' is not a non-negative integer"},
      {{{"LOOM_RANK", "0"}, {"LOOM_WORLD", "0"}}, "LOOM_WORLD=0 is outside 1..8"},
      {{{"LOOM_RANK", "0"}, {"LOOM_WORLD", "9"}}, "LOOM_WORLD=9 is outside 1..8"},
      {{{"LOOM_RANK", "2"}, {"LOOM_WORLD", "2"}}, "LOOM_RANK=2 is not below LOOM_WORLD=2"},
      {{{"LOOM_RANK", "0"}, {"LOOM_WORLD", "2"}}, "LOOM_RENDEZVOUS is not set but LOOM_WORLD=2"},
      {{{"LOOM_RANK", "0"}, {"LOOM_WORLD", "2"}, {"LOOM_RENDEZVOUS", "nowhere"}},
       "rendezvous address 'nowhere' has no file: or tcp: scheme"},
      {{{"LOOM_RANK", "0"},
        {"LOOM_WORLD", "2"},
        {"LOOM_RENDEZVOUS", "file:/x"},
        {"LOOM_DEVICE", "gpu1"}},
       "LOOM_DEVICE='gpu1' is not a non-negative integer"},
  };
  for (auto const& [values, expected] : cases) {
    ScopedLoomEnvironment const env(values);
    EXPECT_TRUE(mentions(error_of([] { RankEnvironment::from_environment(); }), expected));
  }
  ScopedLoomEnvironment const env({});
  EXPECT_TRUE(mentions(error_of([] { RankEnvironment::from_environment(); }), "scripts/launch.sh"));
}

}  // namespace
}  // namespace loom::test
