// tilemoe launch: starts the N processes of a one-node world (one per GPU), each told its
// place through TILEMOE_RANK / _WORLD_SIZE / _LOCAL_RANK / _LOCAL_SIZE / _RENDEZVOUS (read by
// launch::launch_env), and supervises them: the world fails as a whole, like mpirun's, so a
// rank that dies does not leave the others waiting for it until their timeouts.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "tilemoe/launch/launch_env.hpp"
#include "tilemoe/launch/rendezvous.hpp"
#include "tilemoe/error.hpp"

extern char** environ;

namespace tilemoe::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 64;
// Between SIGTERM and SIGKILL: time for a rank to flush its logs and release its GPU.
constexpr std::chrono::seconds kGrace(5);
// The shell's convention for "could not run the program".
constexpr int kCannotExecute = 127;

struct LaunchOptions {
  int ranks = 0;
  std::string rendezvous;
  double timeout_s = 0;
  std::vector<std::string> program;
};

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return "signal " + std::to_string(signal);
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// SIGINT, SIGTERM and SIGCHLD are blocked while the launcher runs and taken with
// sigtimedwait, so no handler runs at an arbitrary point; the old mask comes back on return
// (and in each child before exec).
class BlockedSignals {
 public:
  BlockedSignals() {
    sigemptyset(&set_);
    // A signal this process ignores (SIGINT in a background job of a script, under nohup)
    // stays ignored: blocked, it would be delivered to sigtimedwait after all.
    for (int signal : {SIGINT, SIGTERM}) {
      struct sigaction current{};
      sigaction(signal, nullptr, &current);
      if (current.sa_handler != SIG_IGN) sigaddset(&set_, signal);
    }
    sigaddset(&set_, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set_, &old_);
    // Under an ignored SIGCHLD the kernel would reap the ranks before we see their status.
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, &old_chld_);
  }
  ~BlockedSignals() {
    sigaction(SIGCHLD, &old_chld_, nullptr);
    sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  const sigset_t& set() const { return set_; }
  const sigset_t& old() const { return old_; }

 private:
  sigset_t set_, old_;
  struct sigaction old_chld_{};
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
};

// This process's environment without the variables the launcher sets, then those.
std::vector<std::string> child_environment(const LaunchOptions& o, int rank) {
  static constexpr const char* kOwn[] = {"TILEMOE_RANK=", "TILEMOE_WORLD_SIZE=", "TILEMOE_LOCAL_RANK=", "TILEMOE_LOCAL_SIZE=",
                                         "TILEMOE_RENDEZVOUS="};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    if (std::none_of(std::begin(kOwn), std::end(kOwn), [&](const char* own) { return entry.rfind(own, 0) == 0; })) {
      env.push_back(entry);
    }
  }
  // One node: the local place is the global one.
  env.push_back("TILEMOE_RANK=" + std::to_string(rank));
  env.push_back("TILEMOE_WORLD_SIZE=" + std::to_string(o.ranks));
  env.push_back("TILEMOE_LOCAL_RANK=" + std::to_string(rank));
  env.push_back("TILEMOE_LOCAL_SIZE=" + std::to_string(o.ranks));
  env.push_back("TILEMOE_RENDEZVOUS=" + o.rendezvous);
  return env;
}

// Starts one rank in its own process group (so that a signal reaches what it started too,
// e.g. the program behind `sh -c`). Returns the pid, or throws with errno of a failed exec.
pid_t spawn(const LaunchOptions& o, int rank, const BlockedSignals& signals, int* exec_error) {
  std::vector<std::string> env = child_environment(o, rank);
  std::vector<char*> envp, argv;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.program;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw_internal(std::string("launch: pipe failed: ") + std::strerror(errno));
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(report[0]);
    ::close(report[1]);
    throw_internal(std::string("launch: fork failed: ") + std::strerror(error));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls from here to exec.
    ::close(report[0]);
    ::setpgid(0, 0);
#ifdef __linux__
    // A launcher killed outright (SIGKILL, OOM) must not leave ranks holding GPUs.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(kCannotExecute);
#endif
    ::sigprocmask(SIG_SETMASK, &signals.old(), nullptr);
    environ = envp.data();
    ::execvp(argv[0], argv.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t n = ::write(report[1], &error, sizeof error);
    ::_exit(kCannotExecute);
  }
  (void)launcher;
  ::setpgid(pid, pid);  // also here, so that no signal can reach the group before it exists
  ::close(report[1]);
  // The pipe closes on a successful exec (close-on-exec) or carries exec's errno.
  int error = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  *exec_error = n == static_cast<ssize_t>(sizeof error) ? error : 0;
  return pid;
}

class World {
 public:
  World(const LaunchOptions& options, const BlockedSignals& signals)
      : o_(options), signals_(signals), ranks_(static_cast<std::size_t>(options.ranks)) {}

  int run() {
    for (int r = 0; r < o_.ranks; ++r) {
      int exec_error = 0;
      Rank& rank = ranks_[static_cast<std::size_t>(r)];
      try {
        rank.pid = spawn(o_, r, signals_, &exec_error);
      } catch (const Error& e) {
        // The ranks already started must not be left behind.
        std::fprintf(stderr, "tilemoe launch: cannot start rank %d: %s\n", r, e.what());
        failure(1);
        break;
      }
      rank.running = true;
      if (exec_error != 0) {
        // That child is exiting already: collect it, so that it does not count as one to stop.
        int status = 0;
        while (::waitpid(rank.pid, &status, 0) < 0 && errno == EINTR) {
        }
        rank.running = false;
        std::fprintf(stderr, "tilemoe launch: cannot execute '%s': %s\n", o_.program[0].c_str(), std::strerror(exec_error));
        failure(kCannotExecute);
        break;
      }
    }
    const Clock::time_point run_deadline =
        o_.timeout_s > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeout_s))
                         : Clock::time_point::max();
    while (reap()) {
      const Clock::time_point now = Clock::now();
      if (!stopping_ && now >= run_deadline) {
        std::fprintf(stderr, "tilemoe launch: the world did not finish within --timeout-s %g; %s still running\n", o_.timeout_s,
                     rank_list(running()).c_str());
        failure(1);
      }
      if (stopping_ && !killed_ && now >= stop_deadline_) {
        std::fprintf(stderr, "tilemoe launch: %s did not stop within %lld s: killing (SIGKILL)\n", rank_list(running()).c_str(),
                     static_cast<long long>(kGrace.count()));
        signal_all(SIGKILL);
        killed_ = true;
        stop_deadline_ = now + kGrace;
      } else if (killed_ && now >= stop_deadline_) {
        // Not even SIGKILL ended them (a process stuck in the kernel, e.g. a GPU driver call):
        // waiting longer would make the launcher hang with them.
        std::fprintf(stderr, "tilemoe launch: %s still there %lld s after SIGKILL: giving up on them\n",
                     rank_list(running()).c_str(), static_cast<long long>(kGrace.count()));
        break;
      }
      // Wake at least every 100 ms: reaping by polling does not depend on SIGCHLD reaching us.
      Clock::time_point wake = std::min(now + std::chrono::milliseconds(100), run_deadline);
      if (stopping_) wake = std::min(wake, stop_deadline_);
      const auto wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(wake - now, Clock::duration::zero())).count();
      const timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
      const int signal = ::sigtimedwait(&signals_.set(), nullptr, &ts);
      if (signal == SIGINT || signal == SIGTERM) {
        std::fprintf(stderr, "tilemoe launch: got %s, passing it on to %s\n", signal_name(signal).c_str(), rank_list(running()).c_str());
        if (interrupted_ == 0) interrupted_ = signal;
        signal_all(signal);
        begin_stop();
      }
    }
    // Interrupted from outside: the shell's convention, whatever the ranks did with it.
    if (interrupted_ != 0) return 128 + interrupted_;
    return exit_code_;
  }

 private:
  std::vector<int> running() const {
    std::vector<int> out;
    for (int r = 0; r < o_.ranks; ++r) {
      if (ranks_[static_cast<std::size_t>(r)].running) out.push_back(r);
    }
    return out;
  }

  void signal_all(int signal) {
    for (const Rank& rank : ranks_) {
      if (rank.running) ::kill(-rank.pid, signal);
    }
  }

  void begin_stop() {
    if (stopping_) return;
    stopping_ = true;
    stop_deadline_ = Clock::now() + kGrace;
  }

  // The first failure sets the exit code and stops the others.
  void failure(int code) {
    if (stopping_) return;
    exit_code_ = code;
    const std::vector<int> others = running();
    if (!others.empty()) {
      std::fprintf(stderr, "tilemoe launch: stopping %s (SIGTERM)\n", rank_list(others).c_str());
      signal_all(SIGTERM);
    }
    begin_stop();
  }

  // Collects the ranks that ended; false once none runs.
  bool reap() {
    bool any = false;
    for (int r = 0; r < o_.ranks; ++r) {
      Rank& rank = ranks_[static_cast<std::size_t>(r)];
      if (!rank.running) continue;
      int status = 0;
      const pid_t done = ::waitpid(rank.pid, &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) {
        any = true;
        continue;
      }
      rank.running = false;
      if (done < 0) {
        std::fprintf(stderr, "tilemoe launch: lost track of rank %d: %s\n", r, std::strerror(errno));
        failure(1);
        continue;
      }
      if (stopping_) continue;  // ended by our SIGTERM, or after the failure that is reported
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "tilemoe launch: rank %d exited with code %d\n", r, WEXITSTATUS(status));
        failure(WEXITSTATUS(status));
      } else if (WIFSIGNALED(status)) {
        std::fprintf(stderr, "tilemoe launch: rank %d was killed by signal %s\n", r, signal_name(WTERMSIG(status)).c_str());
        failure(1);
      }
    }
    return any;
  }

  const LaunchOptions& o_;
  const BlockedSignals& signals_;
  std::vector<Rank> ranks_;
  bool stopping_ = false, killed_ = false;
  Clock::time_point stop_deadline_;
  int exit_code_ = 0;
  int interrupted_ = 0;
};

int launch(LaunchOptions options) {
  if (options.ranks < 1 || options.ranks > kMaxRanks) {
    throw_bad_input("launch: -n " + std::to_string(options.ranks) + " is outside 1.." + std::to_string(kMaxRanks));
  }
  if (!(options.timeout_s >= 0) || !std::isfinite(options.timeout_s)) {
    throw_bad_input("launch: --timeout-s must be 0 (no limit) or positive");
  }
  if (options.program.empty()) throw_bad_input("launch: no program to start: tilemoe launch -n N -- program args...");
  if (options.rendezvous.empty()) {
    // One node: loopback, on a port free now (rank 0 reports it clearly if taken meanwhile).
    options.rendezvous = "127.0.0.1:" + std::to_string(launch::pick_free_port("127.0.0.1"));
  } else {
    launch::parse_host_port(options.rendezvous, "--rendezvous");
  }
  std::fflush(nullptr);  // nothing buffered may be written twice by the children
  const BlockedSignals signals;
  World world(options, signals);
  return world.run();
}

}  // namespace

void add_launch_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<LaunchOptions>();
  CLI::App* command = app.add_subcommand(
      "launch", "start N processes of a one-node world (one per GPU), each with TILEMOE_RANK, TILEMOE_WORLD_SIZE, "
                "TILEMOE_LOCAL_RANK, TILEMOE_LOCAL_SIZE and TILEMOE_RENDEZVOUS set; usage: tilemoe launch -n N -- program args...");
  command->add_option("-n,--ranks", options->ranks, "number of processes, 1.." + std::to_string(kMaxRanks))->required();
  command->add_option("--rendezvous", options->rendezvous,
                      "host:port where rank 0's rendezvous listens (default: 127.0.0.1 and a free port)");
  command->add_option("--timeout-s", options->timeout_s, "stop the world if it runs longer than this (0: no limit)")->capture_default_str();
  // After --, everything is the program's, options like -n included. Without --, the
  // program's own options would be taken for launch's (and rejected).
  command->add_option("program", options->program, "the program to start and its arguments, after --");
  command->callback([options, &exit_code] { exit_code = launch(*options); });
}

}  // namespace tilemoe::cli
