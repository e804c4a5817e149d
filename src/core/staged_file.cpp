#include "tilemoe/staged_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tilemoe/error.hpp"

namespace tilemoe {

namespace {

std::string errno_text(int error_number) { return std::error_code(error_number, std::generic_category()).message(); }

// The temporaries an interrupt must remove. A signal handler may only call async-signal-safe
// functions and touch lock-free atomics, so this is a fixed table of fixed buffers, not a
// container: a slot is claimed, filled, then published; the handler unlinks published slots.
constexpr int kSlots = 64;
constexpr std::size_t kMaxPath = 4096;
struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 published
  char path[kMaxPath] = {};
};
std::array<Slot, kSlots> slots;
static_assert(std::atomic<int>::is_always_lock_free);

int publish(const std::string& path) {
  if (path.size() >= kMaxPath) return -1;  // too long to remember: only the destructor removes it
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!slots[i].state.compare_exchange_strong(expected, 1)) continue;
    std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
    slots[i].state.store(2);
    return i;
  }
  return -1;  // more than kSlots files staged at once: the rest are not covered on an interrupt
}

void unpublish(int slot) {
  if (slot < 0) return;
  slots[slot].state.store(1);
  slots[slot].path[0] = '\0';
  slots[slot].state.store(0);
}

extern "C" void remove_temporaries_and_die(int signal_number) {
  for (Slot& slot : slots) {
    if (slot.state.load() == 2) ::unlink(slot.path);
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

std::atomic<unsigned> next_temporary{0};

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

void check_output_target(const std::string& path, const std::string& option) {
  if (path.empty()) throw_bad_input(option + " is empty: name a file");
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0) {
    if (!S_ISREG(status.st_mode)) {
      throw_bad_input(option + " " + path + " is " + kind_of(status.st_mode) +
                      ", not a regular file: name a regular file to replace or a new path");
    }
    return;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty() && !std::filesystem::is_directory(parent, error)) {
    throw_bad_input(option + " " + path + ": the directory " + parent.string() + " does not exist: create it or name another path");
  }
}

bool same_output_target(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea), cb = std::filesystem::weakly_canonical(b, eb);
  if (ea || eb) return a == b;
  return ca == cb;
}

StagedFile::StagedFile(std::string path) : path_(std::move(path)) {
  temporary_path_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(next_temporary.fetch_add(1));
  // published before it exists, so that no interrupt falls between creation and publication
  slot_ = publish(temporary_path_);
  fd_ = ::open(temporary_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int error = errno;
    unpublish(slot_);
    throw_bad_input(path_ + ": cannot create the temporary file " + temporary_path_ + ": " + errno_text(error));
  }
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : path_(std::move(other.path_)), temporary_path_(std::move(other.temporary_path_)), fd_(other.fd_), slot_(other.slot_),
      committed_(other.committed_) {
  other.fd_ = -1;
  other.slot_ = -1;
  other.committed_ = true;  // the moved-from object owns nothing to remove
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_path_.c_str());
  unpublish(slot_);
}

void StagedFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) throw_internal(path_ + ": write to a staged file after it was finished");
  // write() may write less than asked (and at most about 2 GiB per call on Linux)
  constexpr std::size_t kMaxChunk = std::size_t{1} << 30;
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd_, bytes.data(), std::min(bytes.size(), kMaxChunk));
    if (written < 0) {
      if (errno == EINTR) continue;
      throw_bad_input(path_ + ": cannot write the temporary file " + temporary_path_ + ": " + errno_text(errno));
    }
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
}

void StagedFile::write(const std::string& text) {
  write(std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

void StagedFile::finish() {
  if (fd_ < 0) return;
  // Flush before the rename: otherwise a crash soon after could leave the target naming a
  // file whose blocks never reached the disk.
  if (::fsync(fd_) != 0) {
    throw_bad_input(path_ + ": cannot flush the temporary file " + temporary_path_ + ": " + errno_text(errno));
  }
  const int result = ::close(fd_);  // on some file systems a failed write only shows up here
  fd_ = -1;
  if (result != 0) throw_bad_input(path_ + ": cannot close the temporary file " + temporary_path_ + ": " + errno_text(errno));
}

void StagedFile::commit() {
  finish();
  struct stat status {};
  if (::stat(path_.c_str(), &status) == 0 && !S_ISREG(status.st_mode)) {
    throw_bad_input(path_ + ": cannot rename the temporary file onto it: it is " + std::string(kind_of(status.st_mode)) +
                    ", not a regular file; name a regular file to replace or a new path");
  }
  if (::rename(temporary_path_.c_str(), path_.c_str()) != 0) {
    throw_bad_input(path_ + ": cannot rename the temporary file " + temporary_path_ + " onto it: " + errno_text(errno));
  }
  committed_ = true;
  unpublish(slot_);
  slot_ = -1;
}

void remove_staged_files_on_interrupt() {
  struct sigaction action {};
  action.sa_handler = remove_temporaries_and_die;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    // an ignored signal (a background job of a script, nohup) stays ignored
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    ::sigaction(signal_number, &action, nullptr);
  }
}

}  // namespace tilemoe
