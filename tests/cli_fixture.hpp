#pragma once
// Runs the tilemoe CLI as a user would, in a fresh directory per test: exit code, stdout, stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tilemoe::testing {

struct Result {
  int code = -1;
  std::string out, err;
  double seconds = 0.0;
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("tilemoe_cli_" + std::to_string(::getpid()) + "_" + test->test_suite_name() + "_" + test->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // kill_after_s > 0: a run that hangs is killed then (exit code 137) instead of hanging the
  // test; seconds says how long it took.
  Result tilemoe(const std::string& args, int kill_after_s = 0) {
    const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
    const std::string bound = kill_after_s > 0 ? "timeout -s KILL " + std::to_string(kill_after_s) + " " : "";
    const std::string command = bound + std::string(TILEMOE_CLI) + " " + args + " >" + out + " 2>" + err;
    const auto start = std::chrono::steady_clock::now();
    const int status = std::system(command.c_str());
    Result r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  static std::string slurp(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

}  // namespace tilemoe::testing
