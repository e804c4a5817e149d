#pragma once
// A file that appears whole or not at all: written under a temporary name in its target's
// directory and renamed onto the target only when complete. A failure, or an interrupt once
// remove_staged_files_on_interrupt() is installed, leaves nothing behind, and an existing
// target is untouched until the rename.
#include <cstddef>
#include <span>
#include <string>

namespace tilemoe {

// Refuses (a bad-input error naming `option` and the path) a target that exists but is not a
// regular file, or that cannot be created because its directory does not exist. Renaming onto a
// device node, a FIFO or a socket would replace it with a regular file (as root, --output
// /dev/null replaced /dev/null); a symbolic link is judged by what it points to.
void check_output_target(const std::string& path, const std::string& option);

// Whether two target paths name the same file: the same inode when both exist, else the same
// absolute path once the existing part of each is resolved.
bool same_output_target(const std::string& a, const std::string& b);

class StagedFile {
 public:
  // Creates the temporary "<path>.tmp.<pid>.<n>" (a bad-input error naming path if it cannot).
  explicit StagedFile(std::string path);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile& operator=(StagedFile&&) = delete;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile();  // removes the temporary unless committed

  void write(std::span<const std::byte> bytes);
  void write(const std::string& text);
  // Flushes the temporary to disk and closes it; commit() does it if not done yet.
  void finish();
  // Checks the target (check_output_target) and renames the temporary onto it.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return temporary_path_; }

 private:
  std::string path_, temporary_path_;
  int fd_ = -1;
  int slot_ = -1;  // in the table of temporaries to remove on an interrupt; -1 if none
  bool committed_ = false;
};

// Installs handlers for SIGINT, SIGTERM and SIGHUP that remove every live StagedFile's
// temporary, then let the signal end the process as it would have (an ignored signal stays
// ignored). Call once, early in main.
void remove_staged_files_on_interrupt();

}  // namespace tilemoe
