// A file that appears whole or not at all, also when the process is interrupted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tilemoe/error.hpp"
#include "tilemoe/staged_file.hpp"

using namespace tilemoe;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

class StagedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tilemoe_staged_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(StagedFileTest, AppearsOnlyOnCommit) {
  {
    StagedFile file(path("a"));
    file.write(std::string("hello"));
    EXPECT_FALSE(fs::exists(path("a")));
    file.commit();
  }
  std::ifstream in(path("a"));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "hello");
  {
    StagedFile abandoned(path("b"));
    abandoned.write(std::string("half"));
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"a"});
}

TEST_F(StagedFileTest, ANodeThatIsNotARegularFileIsNeverReplaced) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  EXPECT_THROW(check_output_target(path("fifo"), "--output"), Error);
  {
    StagedFile file(path("fifo"));
    file.write(std::string("x"));
    try {
      file.commit();
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_THAT(e.what(), HasSubstr("is a FIFO, not a regular file"));
    }
  }
  EXPECT_TRUE(fs::is_fifo(path("fifo")));
  EXPECT_EQ(entries(), std::vector<std::string>{"fifo"});
  check_output_target(path("new"), "--output");  // absent, in an existing directory: fine
  EXPECT_THROW(check_output_target(path("no/such/dir"), "--output"), Error);
}

TEST_F(StagedFileTest, SameTargetSeesThroughSpellings) {
  EXPECT_TRUE(same_output_target(path("x"), dir_.string() + "/./x"));
  EXPECT_TRUE(same_output_target(path("x"), dir_.string() + "/../" + dir_.filename().string() + "/x"));
  EXPECT_FALSE(same_output_target(path("x"), path("y")));
  std::ofstream(path("real")) << "1";
  fs::create_symlink(path("real"), path("link"));
  EXPECT_TRUE(same_output_target(path("real"), path("link")));
}

TEST_F(StagedFileTest, AnInterruptRemovesTheTemporary) {
  for (const int signal_number : {SIGINT, SIGTERM}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      remove_staged_files_on_interrupt();
      StagedFile file(path("out"));
      file.write(std::string(1 << 20, 'x'));
      std::raise(signal_number);
      ::_exit(0);  // not reached: the signal ends the process
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal_number) << status;
    EXPECT_TRUE(entries().empty()) << entries().front();
  }
}
